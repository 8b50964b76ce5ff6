"""The server's output path, driven by scripted harmony tokens through the official clients."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from openai import OpenAI

from osserve.server.app import ServerConfig, create_app
from osserve.tokenizer import load_tokenizer
from tests.server.serving import serve
from tests.server.stub_engine import ScriptedEngine

MODEL = "stub"


def toks(text: str) -> list[int]:
    return load_tokenizer().encoding.encode(text, allowed_special="all")  # type: ignore[attr-defined]


REASON_FINAL = toks("<|channel|>analysis<|message|>Two plus two.<|end|><|start|>assistant"
                    "<|channel|>final<|message|>It is 4.<|return|>")
TOOL_CALL = toks("<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
                 'to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}<|call|>')
PREAMBLE_TWO_CALLS = toks("<|channel|>commentary<|message|>Checking both.<|end|><|start|>assistant to=functions.a"
                          "<|channel|>commentary<|message|>{\"x\": 1}<|end|><|start|>assistant to=functions.b"
                          "<|channel|>commentary<|message|>{\"y\": 2}<|call|>")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def stub() -> ScriptedEngine:
    return ScriptedEngine()


@pytest.fixture(scope="module")
def base(stub: ScriptedEngine) -> Iterator[str]:
    with serve(create_app(stub, load_tokenizer(), ServerConfig(model_name=MODEL))) as url:
        yield url


@pytest.fixture
def client(base: str) -> OpenAI:
    return OpenAI(base_url=base + "/v1", api_key="none")


def ask(client: OpenAI, **kw):  # type: ignore[no-untyped-def]
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "2+2?"}], **kw)


def test_reasoning_and_final(client: OpenAI, stub: ScriptedEngine) -> None:
    stub.script = REASON_FINAL
    r = ask(client)
    m = r.choices[0].message
    assert m.content == "It is 4." and m.reasoning == "Two plus two." and m.reasoning_content == "Two plus two."
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == len(REASON_FINAL)
    assert r.usage.completion_tokens_details.reasoning_tokens == len(toks("Two plus two."))
    assert r.usage.prompt_tokens_details.cached_tokens == 16
    assert ask(client, extra_body={"include_reasoning": False}).choices[0].message.reasoning is None


def test_streaming_deltas(client: OpenAI, stub: ScriptedEngine) -> None:
    stub.script = REASON_FINAL
    chunks = list(ask(client, stream=True, stream_options={"include_usage": True}))
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning", None) or "" for c in chunks if c.choices)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert reasoning == "Two plus two." and content == "It is 4."
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(REASON_FINAL)
    assert "<|" not in reasoning + content


def test_tool_call(client: OpenAI, stub: ScriptedEngine) -> None:
    stub.script = TOOL_CALL
    r = ask(client, tools=TOOLS)
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Oslo"}
    assert call.id.startswith("call_") and r.choices[0].message.reasoning == "Need weather."


def test_tool_call_streaming_shape(client: OpenAI, stub: ScriptedEngine) -> None:
    stub.script = TOOL_CALL
    calls = [c.choices[0].delta.tool_calls for c in ask(client, tools=TOOLS, stream=True)
             if c.choices and c.choices[0].delta.tool_calls]
    first, rest = calls[0][0], [c[0] for c in calls[1:]]
    assert first.id and first.type == "function" and first.function.name == "get_weather"
    assert all(x.id is None and x.function.name is None and x.index == 0 for x in rest)
    assert json.loads("".join(x.function.arguments for x in rest)) == {"city": "Oslo"}


def test_preamble_and_two_calls(client: OpenAI, stub: ScriptedEngine) -> None:
    stub.script = PREAMBLE_TWO_CALLS
    r = ask(client, tools=TOOLS)
    m = r.choices[0].message
    assert m.content == "Checking both."
    assert [(c.function.name, c.function.arguments) for c in m.tool_calls] == [("a", '{"x": 1}'), ("b", '{"y": 2}')]
    assert len({c.id for c in m.tool_calls}) == 2 and r.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("script", [
    "<|return|><|channel|>final<|message|>after stop",
    "<|channel|>final<|message|>cut off mid",
    "<|channel|><|channel|><|message|><|message|>bad header<|end|>",
    "<|channel|>commentary to=browser.search<|message|>{\"q\": 1}<|call|>",
    "no header at all " * 10,
    "<|start|><|start|><|end|><|constrain|>x<|reserved_200010|>",
])
def test_malformed_output_never_fails(client: OpenAI, stub: ScriptedEngine, script: str) -> None:
    stub.script = toks(script)
    for stream in (False, True):
        if stream:
            text = "".join((c.choices[0].delta.content or "") for c in ask(client, stream=True) if c.choices)
        else:
            m = ask(client).choices[0].message
            text = (m.content or "") + (m.reasoning or "")
        assert "<|" not in text


def decoded_prompt(stub: ScriptedEngine) -> str:
    return load_tokenizer().decode(stub.prompts[-1])


def test_tool_result_round_trip(client: OpenAI, stub: ScriptedEngine) -> None:
    stub.script = REASON_FINAL
    msgs = [{"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "reasoning_content": "Need weather.", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS)
    prompt = decoded_prompt(stub)
    assert "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>sunny<|end|>" in prompt
    assert "Need weather." in prompt  # the chain of thought since the last final is kept
    msgs[-1]["tool_call_id"] = "call_unknown"
    with pytest.raises(Exception) as info:
        client.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS)
    assert getattr(info.value, "status_code", None) == 400


def test_multi_turn_drops_old_reasoning(client: OpenAI, stub: ScriptedEngine) -> None:
    stub.script = REASON_FINAL
    client.chat.completions.create(model=MODEL, messages=[
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "answer one", "reasoning": "OLD THOUGHTS"},
        {"role": "user", "content": "second"}])
    prompt = decoded_prompt(stub)
    assert "answer one" in prompt and "OLD THOUGHTS" not in prompt


def test_tool_choice_becomes_the_output_constraint(client: OpenAI, stub: ScriptedEngine) -> None:
    """A forced or forbidden call is the grammar's to enforce: the engine gets the constraint, and
    the prompt is the one without tool_choice (none: without the tools)."""
    stub.script = toks('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
                       '{"city": "Rome"}<|call|>')
    r = ask(client, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    spec = stub.params[-1].structured
    assert spec is not None and (spec.tool_choice, spec.tool_name) == ("named", "get_weather")
    assert decoded_prompt(stub).endswith("<|start|>assistant")
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert r.choices[0].finish_reason == "tool_calls"
    ask(client, tools=TOOLS, tool_choice="required")
    assert stub.params[-1].structured is not None and stub.params[-1].structured.tool_choice == "required"
    ask(client, tools=TOOLS, tool_choice="none")
    assert "get_weather" not in decoded_prompt(stub) and stub.params[-1].structured is not None
    ask(client, tools=TOOLS)
    assert stub.params[-1].structured is None  # auto, no strict tool: nothing to constrain


def test_responses_plain_stream_and_chain(client: OpenAI, stub: ScriptedEngine, base: str) -> None:
    stub.script = REASON_FINAL
    r = client.responses.create(model=MODEL, input="2+2?", instructions="Be brief")
    assert r.output_text == "It is 4." and [o.type for o in r.output] == ["reasoning", "message"]
    assert r.usage.output_tokens == len(REASON_FINAL) and r.usage.output_tokens_details.reasoning_tokens > 0
    events = list(client.responses.create(model=MODEL, input="again", stream=True, previous_response_id=r.id))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    for kind in ("output_item.added", "content_part.added", "reasoning_text.delta", "reasoning_text.done",
                 "output_text.delta", "output_text.done", "content_part.done", "output_item.done"):
        assert f"response.{kind}" in types
    assert [e.sequence_number for e in events] == list(range(len(events)))
    prompt = decoded_prompt(stub)
    assert "2+2?" in prompt and "It is 4." in prompt and "Be brief" in prompt
    got = httpx.get(f"{base}/v1/responses/{r.id}").json()
    assert got["id"] == r.id and got["output"][1]["content"][0]["text"] == "It is 4."


def test_responses_function_call_events(client: OpenAI, stub: ScriptedEngine) -> None:
    stub.script = TOOL_CALL
    tools = [{"type": "function", "name": "get_weather", "parameters": TOOLS[0]["function"]["parameters"]}]
    r = client.responses.create(model=MODEL, input="weather?", tools=tools)
    call = [o for o in r.output if o.type == "function_call"][0]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Oslo"}
    events = list(client.responses.create(model=MODEL, input="weather?", tools=tools, stream=True))
    types = [e.type for e in events]
    assert "response.function_call_arguments.delta" in types and "response.function_call_arguments.done" in types
    stub.script = REASON_FINAL
    r2 = client.responses.create(model=MODEL, previous_response_id=r.id, tools=tools, input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert "functions.get_weather to=assistant<|channel|>commentary<|message|>sunny" in decoded_prompt(stub)
    assert r2.output_text == "It is 4."


def test_completions(client: OpenAI, stub: ScriptedEngine) -> None:
    stub.script = toks("Hello there")
    r = client.completions.create(model=MODEL, prompt="Say", max_tokens=5, echo=True)
    assert r.choices[0].text == "SayHello there" and r.usage.completion_tokens == 2
    text = "".join(c.choices[0].text for c in client.completions.create(model=MODEL, prompt=[1, 2, 3],
                                                                       stream=True, max_tokens=5) if c.choices)
    assert text == "Hello there"


def test_ollama_routes(base: str, stub: ScriptedEngine) -> None:
    stub.script = REASON_FINAL
    lines = [json.loads(x) for x in httpx.post(f"{base}/api/chat", json={
        "model": MODEL + ":latest", "messages": [{"role": "user", "content": "2+2?"}]}).text.splitlines()]
    assert "".join(x["message"]["content"] for x in lines) == "It is 4."
    assert "".join(x["message"].get("thinking", "") for x in lines) == "Two plus two."
    assert lines[-1]["done"] is True and lines[-1]["eval_count"] == len(REASON_FINAL)
    r = httpx.post(f"{base}/api/generate", json={"model": MODEL, "prompt": "2+2?", "stream": False,
                                                 "think": False}).json()
    assert r["response"] == "It is 4." and "thinking" not in r and r["done"]
    assert httpx.get(f"{base}/api/tags").json()["models"][0]["name"] == MODEL
    assert "version" in httpx.get(f"{base}/api/version").json()


def test_disconnect_aborts(base: str, stub: ScriptedEngine) -> None:
    stub.script = toks("word " * 200)
    stub.delay = 0.01
    try:
        with httpx.stream("POST", f"{base}/v1/chat/completions", json={
                "model": MODEL, "stream": True, "messages": [{"role": "user", "content": "x"}]}) as resp:
            for i, _ in enumerate(resp.iter_lines()):
                if i > 3:
                    break
        import time
        deadline = time.monotonic() + 5
        while not stub.aborted and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stub.aborted
    finally:
        stub.delay = 0.0


def test_metrics_move(base: str, client: OpenAI, stub: ScriptedEngine) -> None:
    def count(name: str = "e2e_request_latency_seconds") -> float:
        for line in httpx.get(f"{base}/metrics").text.splitlines():
            if line.startswith(f"osserve:{name}_count"):
                return float(line.split()[-1])
        return 0.0
    stub.script = REASON_FINAL
    before, itls = count(), count("inter_token_latency_seconds")
    ask(client)
    assert count() == before + 1
    assert count("inter_token_latency_seconds") >= itls + len(REASON_FINAL) - 2  # one per token after the first
    assert "osserve:time_to_first_token_seconds_bucket" in httpx.get(f"{base}/metrics").text
