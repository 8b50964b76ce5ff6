"""Every body, chunk, event and error of the OpenAI routes, validated against OpenAI's own OpenAPI
schemas (tests/server/openai_schemas.json) with jsonschema.

Where OpenAI's live API and its published spec disagree, the test follows the live API, and only for
the one field concerned (`live_api_schemas` below); `test_live_deviations_are_real` proves that each
such patch is needed, so a spec that catches up makes the patch fail loudly instead of lingering.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest

from osserve.engine.core.outputs import error_delta
from osserve.server.app import ServerConfig, create_app
from osserve.tokenizer import load_tokenizer
from tests.server.openai_spec import Contract, published_schemas
from tests.server.serving import serve
from tests.server.stub_engine import ScriptedEngine

MODEL = "stub"
CHAT, COMPLETIONS, RESPONSES = "/v1/chat/completions", "/v1/completions", "/v1/responses"
USER = [{"role": "user", "content": "2+2?"}]


def toks(text: str) -> list[int]:
    return load_tokenizer().encoding.encode(text, allowed_special="all")  # type: ignore[attr-defined]


REASON_FINAL = toks("<|channel|>analysis<|message|>Two plus two.<|end|><|start|>assistant"
                    "<|channel|>final<|message|>It is 4.<|return|>")
TOOL_CALL = toks("<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
                 'to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}<|call|>')
PREAMBLE_TWO_CALLS = toks("<|channel|>commentary<|message|>Checking both.<|end|><|start|>assistant "
                          'to=functions.get_weather<|channel|>commentary<|message|>{"city": "Oslo"}<|end|>'
                          '<|start|>assistant to=functions.get_weather<|channel|>commentary<|message|>'
                          '{"city": "Bergen"}<|call|>')
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": PARAMS}}]
RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather", "parameters": PARAMS}]


def live_api_schemas() -> dict[str, Any]:
    """The published schemas, patched where OpenAI's live API sends what its spec forbids."""
    s = published_schemas()
    # Live API: a streamed /v1/completions chunk carries `finish_reason: null` until the choice ends.
    # The spec gives streamed and whole completions one schema, whose finish_reason enum has no null;
    # the whole (non-streamed) body is still checked against the unpatched schema.
    chunk = json.loads(json.dumps(s["CreateCompletionResponse"]))
    choice = chunk["properties"]["choices"]["items"]["properties"]
    choice["finish_reason"] = {"anyOf": [choice["finish_reason"], {"type": "null"}]}
    s["CreateCompletionResponse (streamed chunk, live)"] = chunk
    # Live API: the Response inside `response.created` and `response.in_progress` carries
    # `usage: null` (nothing is counted yet); the spec's Response.usage is not nullable. Only these
    # two events get the nullable usage; completed / incomplete / failed responses are unpatched.
    early = json.loads(json.dumps(s["Response"]))
    usage = early["allOf"][2]["properties"]["usage"]
    early["allOf"][2]["properties"]["usage"] = {"anyOf": [usage, {"type": "null"}]}
    s["Response (before usage, live)"] = early
    for event in ("ResponseCreatedEvent", "ResponseInProgressEvent"):
        s[event]["properties"]["response"] = {"$ref": "#/components/schemas/Response (before usage, live)"}
    return s


STREAMED_COMPLETION = "CreateCompletionResponse (streamed chunk, live)"


@pytest.fixture(scope="module")
def spec() -> Contract:
    return Contract(live_api_schemas())


@pytest.fixture(scope="module")
def stub() -> ScriptedEngine:
    return ScriptedEngine(max_model_len=1000)


@pytest.fixture(scope="module")
def base(stub: ScriptedEngine) -> Iterator[str]:
    config = ServerConfig(model_name=MODEL, max_body_bytes=100_000)
    with serve(create_app(stub, load_tokenizer(), config)) as url:
        yield url


def post(base: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(base + path, json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def stream(base: str, path: str, body: dict[str, Any]) -> list[tuple[str | None, Any]]:
    """The SSE events of a streamed response: (event name, parsed data), `[DONE]` kept as is."""
    with httpx.stream("POST", base + path, json={**body, "stream": True}, timeout=30) as r:
        assert r.status_code == 200, r.read()
        text = r.read().decode()
    events: list[tuple[str | None, Any]] = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        name, data = None, []
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                data.append(line[len("data: "):])
        payload = "\n".join(data)
        events.append((name, payload if payload == "[DONE]" else json.loads(payload)))
    return events


# -- /v1/chat/completions -------------------------------------------------------------------------

def test_chat_plain(base: str, stub: ScriptedEngine, spec: Contract) -> None:
    stub.script = REASON_FINAL
    body = post(base, CHAT, {"model": MODEL, "messages": USER, "n": 2})
    spec.check("CreateChatCompletionResponse", body)
    message = body["choices"][1]["message"]
    assert message["content"] == "It is 4." and message["refusal"] is None
    assert body["choices"][0]["logprobs"] is None and body["choices"][0]["finish_reason"] == "stop"


def test_chat_tool_call(base: str, stub: ScriptedEngine, spec: Contract) -> None:
    stub.script = TOOL_CALL
    body = post(base, CHAT, {"model": MODEL, "messages": USER, "tools": CHAT_TOOLS})
    spec.check("CreateChatCompletionResponse", body)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}


def test_chat_logprobs(base: str, stub: ScriptedEngine, spec: Contract) -> None:
    stub.script = REASON_FINAL
    body = post(base, CHAT, {"model": MODEL, "messages": USER, "logprobs": True, "top_logprobs": 3})
    spec.check("CreateChatCompletionResponse", body)
    logprobs = body["choices"][0]["logprobs"]
    assert logprobs["refusal"] is None and len(logprobs["content"]) == len(REASON_FINAL)
    assert all(len(t["top_logprobs"]) == 3 for t in logprobs["content"])


@pytest.mark.parametrize("case", ["plain", "tools", "logprobs", "usage"])
def test_chat_stream(base: str, stub: ScriptedEngine, spec: Contract, case: str) -> None:
    stub.script = PREAMBLE_TWO_CALLS if case == "tools" else REASON_FINAL
    body: dict[str, Any] = {"model": MODEL, "messages": USER}
    body.update({"plain": {}, "tools": {"tools": CHAT_TOOLS}, "logprobs": {"logprobs": True, "top_logprobs": 2},
                 "usage": {"stream_options": {"include_usage": True}, "n": 2}}[case])
    events = stream(base, CHAT, body)
    assert events[-1] == (None, "[DONE]")
    chunks = [data for _, data in events[:-1]]
    for chunk in chunks:
        spec.check("CreateChatCompletionStreamResponse", chunk)
    finals = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finals == ["tool_calls"] if case == "tools" else finals == ["stop"] * body.get("n", 1)
    if case == "tools":
        calls = [t for c in chunks for t in c["choices"][0]["delta"].get("tool_calls", [])]
        assert [t["index"] for t in calls if "id" in t] == [0, 1]
    if case == "logprobs":
        assert any(c["choices"][0]["logprobs"] for c in chunks if c["choices"])
    if case == "usage":
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 2 * len(REASON_FINAL)


# -- /v1/completions ------------------------------------------------------------------------------

def test_completions(base: str, stub: ScriptedEngine, spec: Contract) -> None:
    stub.script = toks("Once upon a time")
    for extra in ({}, {"logprobs": 2, "echo": True}, {"max_tokens": 2}):
        body = post(base, COMPLETIONS, {"model": MODEL, "prompt": "Tell me", **extra})
        spec.check("CreateCompletionResponse", body)
    assert body["choices"][0]["finish_reason"] == "length"


def test_completions_stream(base: str, stub: ScriptedEngine, spec: Contract) -> None:
    stub.script = toks("Once upon a time")
    events = stream(base, COMPLETIONS, {"model": MODEL, "prompt": "Tell me", "logprobs": 1, "echo": True,
                                        "stream_options": {"include_usage": True}})
    assert events[-1] == (None, "[DONE]")
    chunks = [data for _, data in events[:-1]]
    for chunk in chunks:
        spec.check(STREAMED_COMPLETION, chunk)
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert reasons[-1] == "stop" and set(reasons[:-1]) == {None}  # the live-API deviation, exercised
    assert chunks[-1]["usage"]["completion_tokens"] == len(stub.script)


# -- /v1/responses --------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["plain", "function_call", "two_calls", "max_output_tokens"])
def test_responses(base: str, stub: ScriptedEngine, spec: Contract, case: str) -> None:
    stub.script = {"function_call": TOOL_CALL, "two_calls": PREAMBLE_TWO_CALLS}.get(case, REASON_FINAL)
    request: dict[str, Any] = {"model": MODEL, "input": "2+2?", "instructions": "Be brief.", "tools": RESPONSES_TOOLS}
    if case == "max_output_tokens":
        request["max_output_tokens"] = len(REASON_FINAL) - 3
    body = post(base, RESPONSES, request)
    spec.check("Response", body)
    spec.check("Response", httpx.get(f"{base}{RESPONSES}/{body['id']}").json())
    assert body["tools"][0]["strict"] is None and body["tools"][0]["name"] == "get_weather"
    kinds = [item["type"] for item in body["output"]]
    if case == "plain":
        assert body["status"] == "completed" and kinds == ["reasoning", "message"]
        assert body["output"][1]["content"][0]["logprobs"] == []
    elif case == "function_call":
        assert body["status"] == "completed" and kinds == ["reasoning", "function_call"]
    elif case == "two_calls":
        assert body["status"] == "completed" and kinds == ["message", "function_call", "function_call"]
    else:
        assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
        assert body["output"][-1]["status"] == "incomplete" and body["usage"]["output_tokens"] == len(REASON_FINAL) - 3


@pytest.mark.parametrize("case", ["plain", "function_call", "two_calls", "max_output_tokens"])
def test_responses_stream(base: str, stub: ScriptedEngine, spec: Contract, case: str) -> None:
    stub.script = {"function_call": TOOL_CALL, "two_calls": PREAMBLE_TWO_CALLS}.get(case, REASON_FINAL)
    request: dict[str, Any] = {"model": MODEL, "input": "2+2?", "tools": RESPONSES_TOOLS}
    if case == "max_output_tokens":
        request["max_output_tokens"] = len(REASON_FINAL) - 3
    events = stream(base, RESPONSES, request)
    for name, event in events:
        assert name == event["type"]
        spec.check_event(event)
    kinds = [event["type"] for _, event in events]
    assert [event["sequence_number"] for _, event in events] == list(range(len(events)))
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert events[0][1]["response"]["usage"] is None  # the live-API deviation, exercised
    last = events[-1][1]
    if case == "max_output_tokens":
        assert kinds[-1] == "response.incomplete" and "response.completed" not in kinds
        assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    else:
        assert kinds[-1] == "response.completed" and last["response"]["status"] == "completed"
    if case in ("function_call", "two_calls"):
        assert kinds.count("response.function_call_arguments.done") == (2 if case == "two_calls" else 1)
    else:
        assert "response.output_text.delta" in kinds and "response.output_text.done" in kinds


# -- /v1/models -----------------------------------------------------------------------------------

def test_models(base: str, spec: Contract) -> None:
    body = httpx.get(base + "/v1/models").json()
    spec.check("ListModelsResponse", body)
    assert body["data"][0]["id"] == MODEL


# -- error bodies ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("method", "path", "body", "status"), [
    ("POST", CHAT, {"model": MODEL, "messages": USER, "temperature": "hot"}, 400),  # pydantic validation
    ("POST", CHAT, {"model": MODEL}, 400),  # a missing field
    ("POST", CHAT, b'{"model": ', 400),  # not JSON
    ("POST", CHAT, {"model": MODEL, "messages": USER, "max_tokens": 5000}, 400),  # past the context
    ("POST", CHAT, {"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}]}, 400),
    ("POST", COMPLETIONS, {"model": MODEL, "prompt": [[1], [2]]}, 400),
    ("POST", RESPONSES, {"model": MODEL, "input": "x", "previous_response_id": "resp_nope"}, 400),
    ("POST", CHAT, {"model": "other", "messages": USER}, 404),
    ("GET", RESPONSES + "/resp_nope", None, 404),
    ("GET", "/v1/no-such-route", None, 404),
    ("GET", CHAT, None, 405),
    ("POST", CHAT, {"model": MODEL, "messages": [{"role": "user", "content": "x" * 200_000}]}, 413),
])
def test_error_bodies(base: str, spec: Contract, method: str, path: str, body: Any, status: int) -> None:
    kw: dict[str, Any] = {"content": body, "headers": {"content-type": "application/json"}} \
        if isinstance(body, bytes) else {"json": body}
    r = httpx.request(method, base + path, timeout=30, **({} if body is None else kw))
    assert r.status_code == status, r.text
    spec.check("ErrorResponse", r.json())


def test_error_401(spec: Contract) -> None:
    engine = ScriptedEngine(toks("ok"))
    with serve(create_app(engine, load_tokenizer(), ServerConfig(model_name=MODEL, api_key="sekret"))) as url:
        r = httpx.post(url + CHAT, json={"model": MODEL, "messages": USER}, headers={"Authorization": "Bearer no"})
        assert r.status_code == 401
        spec.check("ErrorResponse", r.json())
        assert r.json()["error"]["code"] == "invalid_api_key"


class _DiesMidStream(ScriptedEngine):
    async def generate(self, prompt_token_ids, params, request_id):  # type: ignore[no-untyped-def,override]
        async for d in super().generate(prompt_token_ids, params, request_id):
            yield replace(d, finished=False, finish_reason=None, stop_reason=None)  # never reaches its end
        yield error_delta(request_id, "the step loop failed")


def test_errors_mid_stream(spec: Contract) -> None:
    """A request the engine cannot finish ends with an error the client can parse: an error event in
    place of the finish chunk when streamed, `response.failed` in Responses, a 503 body when not."""
    engine = _DiesMidStream(toks("<|channel|>final<|message|>It is"))
    with serve(create_app(engine, load_tokenizer(), ServerConfig(model_name=MODEL))) as url:
        for path, body, chunk_schema in ((CHAT, {"messages": USER}, "CreateChatCompletionStreamResponse"),
                                         (COMPLETIONS, {"prompt": "It"}, STREAMED_COMPLETION)):
            events = stream(url, path, {"model": MODEL, **body})
            assert events[-1] == (None, "[DONE]")
            errors = [data for _, data in events[:-1] if "error" in data]
            assert len(errors) == 1 and errors[0]["error"]["message"] == "the step loop failed"
            spec.check("ErrorResponse", errors[0])
            for _, data in events[:-1]:
                if "error" not in data:
                    spec.check(chunk_schema, data)
                    assert all(c["finish_reason"] is None for c in data["choices"])
            r = httpx.post(url + path, json={"model": MODEL, **body}, timeout=30)
            assert r.status_code == 503
            spec.check("ErrorResponse", r.json())
        for streamed in (True, False):
            request = {"model": MODEL, "input": "2+2?", "stream": streamed}
            if streamed:
                events = [event for _, event in stream(url, RESPONSES, request)]
                for event in events:
                    spec.check_event(event)
                assert events[-1]["type"] == "response.failed"
                failed = events[-1]["response"]
            else:
                failed = post(url, RESPONSES, request)
                spec.check("Response", failed)
            assert failed["status"] == "failed" and failed["error"]["message"] == "the step loop failed"
            assert failed["output"][-1]["status"] == "incomplete"


def test_live_deviations_are_real() -> None:
    """Each patch in live_api_schemas is needed: the published schema rejects what the live API sends."""
    published = Contract(published_schemas())
    chunk = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": MODEL,
             "choices": [{"index": 0, "text": "a", "finish_reason": None, "logprobs": None}]}
    with pytest.raises(AssertionError, match="finish_reason"):
        published.check("CreateCompletionResponse", chunk)
    Contract(live_api_schemas()).check(STREAMED_COMPLETION, chunk)
    early = {"id": "resp_1", "object": "response", "created_at": 1, "model": MODEL, "status": "in_progress",
             "output": [], "usage": None, "instructions": None, "error": None, "incomplete_details": None,
             "tools": [], "tool_choice": "auto", "parallel_tool_calls": True, "temperature": 1.0, "top_p": 1.0,
             "metadata": {}}
    event = {"type": "response.created", "sequence_number": 0, "response": early}
    with pytest.raises(AssertionError, match="usage"):
        published.check("ResponseCreatedEvent", event)
    Contract(live_api_schemas()).check("ResponseCreatedEvent", event)
