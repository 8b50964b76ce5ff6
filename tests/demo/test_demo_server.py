"""The built-in demo model through the server: held-out accuracy, tool round trips in Chat
Completions and the Responses API (streaming and not), and the README's showcase."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from osserve.demo.compact import corpus_version
from osserve.demo.corpus import TIME_TOOL, WEATHER_TOOL
from osserve.demo.evaluate import AskRequest, Reply, evaluate, fake_service, heldout_examples
from osserve.demo.showcase import chat_tools, run_showcase
from osserve.demo.weights import DEMO_WEIGHTS
from tests.demo.demo_server import MODEL

CHAT_TOOLS = chat_tools([WEATHER_TOOL, TIME_TOOL])
RESPONSES_TOOLS = [{"type": "function", **c["function"]} for c in CHAT_TOOLS]


def _client(base: str) -> OpenAI:
    return OpenAI(base_url=base + "/v1", api_key="x", timeout=300)


def _message_dict(m: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        d["tool_calls"] = [{"id": c.id, "type": "function",
                            "function": {"name": c.name, "arguments": c.arguments}} for c in m.tool_calls]
    if m.tool_call_id:
        d["tool_call_id"] = m.tool_call_id
    return d


def test_heldout_prompts_through_the_server(base: str) -> None:
    """>= 90% exactly right final answers, >= 95% valid tool calls, on prompts training never saw."""
    pool = heldout_examples(400, version=corpus_version(DEMO_WEIGHTS))  # the corpus the shipped weights learned
    tool_prompts = [ex for ex in pool if ex.tool_call is not None][:30]
    others = [ex for ex in pool if ex.tool_call is None][:80]
    client = _client(base)

    def one(r: AskRequest) -> Reply:
        resp = client.chat.completions.create(
            model=MODEL, messages=[_message_dict(m) for m in r.messages],  # type: ignore[misc]
            tools=chat_tools(r.tools) or None, reasoning_effort=r.effort, temperature=0, max_tokens=200,  # type: ignore[arg-type]
        )
        m = resp.choices[0].message
        return Reply(m.content or "", [(c.function.name, c.function.arguments) for c in m.tool_calls or []])

    def ask(requests: list[AskRequest]) -> list[Reply]:
        with ThreadPoolExecutor(max_workers=110) as pool_:
            return list(pool_.map(one, requests))

    report = evaluate(ask, tool_prompts + others)
    assert report.prompts == 110 and report.tool_calls_expected == 30
    assert report.answer_rate >= 0.90, report.summary() + "\n" + "\n".join(report.failures)
    assert report.tool_call_valid_rate >= 0.95, report.summary() + "\n" + "\n".join(report.failures)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_tool_round_trip(base: str, stream: bool) -> None:
    client = _client(base)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What time is it in Tokyo?"}]
    if stream:
        chunks = list(client.chat.completions.create(model=MODEL, messages=messages, tools=CHAT_TOOLS,  # type: ignore[arg-type]
                                                     temperature=0, stream=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        calls = [tc for d in deltas for tc in d.tool_calls or []]
        name = next(tc.function.name for tc in calls if tc.function and tc.function.name)
        call_id = next(tc.id for tc in calls if tc.id)
        arguments = "".join(tc.function.arguments or "" for tc in calls if tc.function)
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
    else:
        r = client.chat.completions.create(model=MODEL, messages=messages, tools=CHAT_TOOLS, temperature=0)  # type: ignore[arg-type]
        assert r.choices[0].finish_reason == "tool_calls"
        call = r.choices[0].message.tool_calls[0]  # type: ignore[index]
        name, call_id, arguments = call.function.name, call.id, call.function.arguments  # type: ignore[union-attr]
    assert name == "get_time" and json.loads(arguments) == {"city": "Tokyo"}
    result = fake_service(name, json.loads(arguments))
    messages += [{"role": "assistant", "content": None, "tool_calls": [
                     {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]},
                 {"role": "tool", "tool_call_id": call_id, "content": json.dumps(result)}]
    expected = f"It is {result['time']} in Tokyo."
    if stream:
        chunks = list(client.chat.completions.create(model=MODEL, messages=messages, tools=CHAT_TOOLS,  # type: ignore[arg-type]
                                                     temperature=0, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == expected
    else:
        r = client.chat.completions.create(model=MODEL, messages=messages, tools=CHAT_TOOLS, temperature=0)  # type: ignore[arg-type]
        assert r.choices[0].message.content == expected and r.choices[0].finish_reason == "stop"
        assert r.choices[0].message.reasoning  # type: ignore[attr-defined]


@pytest.mark.parametrize("stream", [False, True])
def test_responses_tool_round_trip(base: str, stream: bool) -> None:
    client = _client(base)
    question = "What is the weather in Lisbon?"
    if stream:
        events = list(client.responses.create(model=MODEL, input=question, tools=RESPONSES_TOOLS, stream=True,  # type: ignore[arg-type]
                                              temperature=0))
        first = events[-1].response  # type: ignore[union-attr]
        assert events[-1].type == "response.completed"
        assert any(e.type == "response.function_call_arguments.done" for e in events)
    else:
        first = client.responses.create(model=MODEL, input=question, tools=RESPONSES_TOOLS, temperature=0)  # type: ignore[arg-type]
    assert [o.type for o in first.output] == ["reasoning", "function_call"]
    call = first.output[-1]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Lisbon"}  # type: ignore[union-attr]
    result = fake_service(call.name, json.loads(call.arguments))  # type: ignore[union-attr]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": json.dumps(result)}  # type: ignore[union-attr]
    expected = f"It is {result['temperature_c']}°C and {result['condition']} in Lisbon."
    # stored conversation (previous_response_id: the reasoning is kept) ...
    second = client.responses.create(model=MODEL, previous_response_id=first.id, input=[output],  # type: ignore[list-item]
                                     tools=RESPONSES_TOOLS, temperature=0)  # type: ignore[arg-type]
    assert second.output_text == expected
    # ... and the whole conversation sent back as items, streamed
    items = [{"role": "user", "content": question},
             {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},  # type: ignore[union-attr]
             output]
    events = list(client.responses.create(model=MODEL, input=items, tools=RESPONSES_TOOLS, stream=True,  # type: ignore[arg-type]
                                          temperature=0))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    assert text == expected


def test_showcase_shows_reasoning_an_answer_and_a_tool_round_trip(base: str) -> None:
    lines: list[str] = []
    shown = run_showcase(base, MODEL, say=lines.append)
    assert shown.reasoning and "82" in shown.reasoning and shown.answer == "37 + 45 = 82."
    assert shown.tool_call["name"] == "get_weather" and json.loads(shown.tool_call["arguments"]) == {"city": "Paris"}
    r = shown.tool_result
    assert shown.tool_answer == f"It is {r['temperature_c']}°C and {r['condition']} in Paris."
    assert any("tool call: get_weather" in line for line in lines)
    # Without --tool-server the python round trip says why it is not shown (test_demo_tools runs it).
    assert not shown.python and any(line.startswith("(no python round trip: ") and "--tool-server demo" in line
                                    for line in lines)


def test_builtin_model_is_the_demo_expanded_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from osserve.engine.load import builtin_model_dir

    monkeypatch.setenv("OSSERVE_CACHE_DIR", str(tmp_path))
    first = builtin_model_dir()
    assert first.parent == tmp_path / "models" and first.name.startswith("demo-")
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert builtin_model_dir() == first and (first / "model.safetensors").stat().st_mtime_ns == stamp
    config = json.loads((first / "config.json").read_text())
    assert config["num_local_experts"] == 4 and config["quantization_config"]["quant_method"] == "mxfp4"
    assert DEMO_WEIGHTS.stat().st_size <= 10 * 2**20
