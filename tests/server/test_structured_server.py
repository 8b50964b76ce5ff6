"""Structured outputs through the HTTP server on the tiny random-weight checkpoint, with the official
clients: strict JSON answers, forced tool calls (streamed too), Responses' text.format, Ollama's
format, and the 400s. The model follows nothing by itself: what is valid, the server enforced."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema
import pytest
from openai import BadRequestError, OpenAI

from osserve.engine.async_engine import AsyncEngine
from osserve.engine.load import EngineArgs, build_engine
from osserve.server.app import ServerConfig, create_app
from tests.server.serving import serve

MODEL = "tiny"
ANSWER = {"type": "object", "additionalProperties": False, "required": ["sum", "unit"],
          "properties": {"sum": {"type": "integer", "minimum": 0, "maximum": 200}, "unit": {"enum": ["km", "mi"]}}}
WEATHER = {"type": "object", "additionalProperties": False, "required": ["city"],
           "properties": {"city": {"enum": ["Oslo", "Paris", "Tokyo"]}}}
TIME = {"type": "object", "additionalProperties": False, "required": ["tz"],
        "properties": {"tz": {"type": "string", "maxLength": 8}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
# Enough for the reasoning's share (half) and the answer or call after it.
MAX_TOKENS = 96


@pytest.fixture(scope="module")
def base(tiny_checkpoint: Path) -> Iterator[str]:
    eng = AsyncEngine(build_engine(EngineArgs(model=str(tiny_checkpoint), device="cpu", max_model_len=2048)))
    with serve(create_app(eng, eng.tokenizer, ServerConfig(model_name=MODEL))) as url:
        yield url
    eng.shutdown()


@pytest.fixture
def client(base: str) -> OpenAI:
    return OpenAI(base_url=base + "/v1", api_key="none")


def chat(client: OpenAI, question: str, **kw):  # type: ignore[no-untyped-def]
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}],
                                          max_tokens=MAX_TOKENS, **kw)


def test_strict_json_schema_answers_always_validate(client: OpenAI) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}}
    for i, seed in enumerate((None, 1, 2)):
        r = chat(client, f"What is {i} + 45?", response_format=fmt, temperature=0 if seed is None else 1, seed=seed)
        choice = r.choices[0]
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content or ""), ANSWER)
    r = chat(client, "Give me an object.", response_format={"type": "json_object"}, temperature=0)
    assert r.choices[0].finish_reason == "length" or isinstance(json.loads(r.choices[0].message.content or ""), dict)
    assert (r.choices[0].message.content or "").startswith("{")


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_forced_tool_calls_plain_and_streamed(client: OpenAI, tool_choice: object) -> None:
    for i in range(3):
        r = chat(client, f"Question {i}?", tools=TOOLS, tool_choice=tool_choice, temperature=0)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and not choice.message.content
        (call,) = choice.message.tool_calls or []
        if isinstance(tool_choice, dict):
            assert call.function.name == "get_time"
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    chunks = list(chat(client, "Streamed?", tools=TOOLS, tool_choice=tool_choice, temperature=1, seed=7,
                       stream=True))
    name = "".join(c.choices[0].delta.tool_calls[0].function.name or "" for c in chunks
                   if c.choices and c.choices[0].delta.tool_calls)
    args = "".join(c.choices[0].delta.tool_calls[0].function.arguments or "" for c in chunks
                   if c.choices and c.choices[0].delta.tool_calls)
    assert name in SCHEMAS and chunks[-1].choices[0].finish_reason == "tool_calls"
    jsonschema.validate(json.loads(args), SCHEMAS[name])


def test_tool_choice_none_makes_no_call_and_strict_auto_checks_arguments(client: OpenAI) -> None:
    r = chat(client, "Weather?", tools=TOOLS, tool_choice="none", temperature=1, seed=3)
    assert not r.choices[0].message.tool_calls and r.choices[0].finish_reason in ("stop", "length")
    strict = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER, "strict": True}}]
    for seed in range(3):
        r = chat(client, "Weather?", tools=strict, temperature=1, seed=seed)
        for call in r.choices[0].message.tool_calls or []:
            jsonschema.validate(json.loads(call.function.arguments), WEATHER)


def test_responses_text_format_and_forced_function_call(client: OpenAI) -> None:
    r = client.responses.create(model=MODEL, input="What is 37 + 45?", max_output_tokens=MAX_TOKENS, temperature=0,
                                text={"format": {"type": "json_schema", "name": "answer", "schema": ANSWER,
                                                 "strict": True}})
    assert r.status == "completed" and r.text.format.type == "json_schema"
    jsonschema.validate(json.loads(r.output_text), ANSWER)
    tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
    r = client.responses.create(model=MODEL, input="Weather?", tools=tools, tool_choice="required",  # type: ignore[arg-type]
                                max_output_tokens=MAX_TOKENS, temperature=0)
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)


def test_ollama_format(base: str) -> None:
    body = {"model": MODEL, "stream": False, "options": {"num_predict": MAX_TOKENS, "temperature": 0},
            "messages": [{"role": "user", "content": "Sum?"}], "format": ANSWER}
    r = httpx.post(base + "/api/chat", json=body, timeout=120)
    assert r.status_code == 200, r.text
    jsonschema.validate(json.loads(r.json()["message"]["content"]), ANSWER)
    gen = {"model": MODEL, "stream": False, "prompt": "Sum?", "format": ANSWER,
           "options": {"num_predict": MAX_TOKENS, "temperature": 0}}
    r = httpx.post(base + "/api/generate", json=gen, timeout=120)
    jsonschema.validate(json.loads(r.json()["response"]), ANSWER)
    r = httpx.post(base + "/api/generate", json={**gen, "format": "yaml"}, timeout=30)
    assert r.status_code == 400 and "format" in r.text


@pytest.mark.parametrize(("kw", "param"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "send_email"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "bogus"}, "strict": True}}]},
     "tools[0].function.parameters"),
])
def test_bad_constraints_are_400s_naming_the_parameter(client: OpenAI, kw: dict, param: str) -> None:
    with pytest.raises(BadRequestError) as info:
        chat(client, "hi", **kw)
    error = info.value.body
    assert isinstance(error, dict) and error["param"] == param and error["type"] == "invalid_request_error"


def test_completions_follow_response_format_and_vllms_fields(client: OpenAI) -> None:
    """A raw completion is constrained as a whole: OpenAI's response_format (vLLM takes it on
    completions too), vLLM's structured_outputs and its older guided_* fields, streamed and not."""
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
    for seed in range(3):
        r = client.completions.create(model=MODEL, prompt="The sum as JSON:", max_tokens=64, temperature=1,
                                      seed=seed, extra_body={"response_format": fmt})
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].text), ANSWER)
    chunks = list(client.completions.create(model=MODEL, prompt="Streamed:", max_tokens=64, temperature=1, seed=5,
                                            stream=True, extra_body={"structured_outputs": {"json": ANSWER}}))
    jsonschema.validate(json.loads("".join(c.choices[0].text for c in chunks if c.choices)), ANSWER)
    r = client.completions.create(model=MODEL, prompt="Yes or no?", max_tokens=16, temperature=1, seed=1,
                                  extra_body={"structured_outputs": {"choice": ["yes", "no", "maybe"]}})
    assert r.choices[0].text in ("yes", "no", "maybe")
    r = client.completions.create(model=MODEL, prompt="Code:", max_tokens=16, temperature=1, seed=2,
                                  extra_body={"guided_regex": "[A-Z]{2}-[0-9]{3}"})
    assert re.fullmatch("[A-Z]{2}-[0-9]{3}", r.choices[0].text), r.choices[0].text
    r = client.completions.create(model=MODEL, prompt="JSON:", max_tokens=64, temperature=1, seed=3,
                                  extra_body={"guided_json": json.dumps(WEATHER)})
    jsonschema.validate(json.loads(r.choices[0].text), WEATHER)
    r = client.completions.create(model=MODEL, prompt="Free:", max_tokens=8, temperature=1, seed=4)
    assert r.choices[0].finish_reason == "length"  # nothing asked: the output is free


def test_chat_takes_vllms_structured_outputs_as_the_answer_format(client: OpenAI) -> None:
    for seed in range(2):
        r = chat(client, "What is 3 + 4?", temperature=1, seed=seed,
                 extra_body={"structured_outputs": {"json": ANSWER}})
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content or ""), ANSWER)


@pytest.mark.parametrize(("body", "param"), [
    ({"structured_outputs": {"json": ANSWER}, "response_format": {"type": "json_object"}}, "structured_outputs.json"),
    ({"structured_outputs": {"structural_tag": "x"}}, "structured_outputs.structural_tag"),
    ({"structured_outputs": {"json": ANSWER, "regex": "a"}}, "structured_outputs"),
    ({"structured_outputs": {"json": {"type": "nonsense"}}}, "structured_outputs.json"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_regex"),
    ({"guided_json": ANSWER, "structured_outputs": {"regex": "a"}}, "guided_json"),
])
def test_bad_vllm_constraints_are_400s_naming_the_field(client: OpenAI, body: dict, param: str) -> None:
    for call in (lambda: client.completions.create(model=MODEL, prompt="x", max_tokens=4, extra_body=body),
                 lambda: chat(client, "hi", extra_body=body)):
        with pytest.raises(BadRequestError) as info:
            call()
        error = info.value.body
        assert isinstance(error, dict) and error["param"] == param, error


def test_vllms_json_schema_is_shown_to_the_model_as_response_formats_is() -> None:
    """In chat, structured_outputs' schema reaches harmony's "# Response Formats" section, as the
    same schema in response_format does: the prompts are the same tokens."""
    from osserve.server.chat import render_request
    from osserve.server.protocol import ChatCompletionRequest

    messages = [{"role": "user", "content": "Sum?"}]
    ours = render_request(ChatCompletionRequest(model=MODEL, messages=messages,
                                                structured_outputs={"json": ANSWER}))
    theirs = render_request(ChatCompletionRequest(model=MODEL, messages=messages, response_format={
        "type": "json_schema", "json_schema": {"name": "response", "schema": ANSWER}}))
    plain = render_request(ChatCompletionRequest(model=MODEL, messages=messages))
    assert ours[0] == theirs[0] != plain[0]
    assert ours[1] is not None and ours[1].json_schema == ANSWER and ours[1].answer_param == "structured_outputs.json"
