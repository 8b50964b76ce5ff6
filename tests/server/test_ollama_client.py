"""The official `ollama` Python client against osserve's /api/* routes, on the built-in demo model:
chat (streaming and not, with `think`, with a tool round trip), generate, list, show, ps, and
/api/version (the client has no call for it). The counts are the request's, the durations
Ollama's (nanoseconds) and consistent: load + prompt eval + eval fit in the total."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import ollama
import pytest

from osserve import __version__
from osserve.config import ModelConfig
from osserve.demo.compact import expand_compact
from osserve.demo.corpus import WEATHER_TOOL
from osserve.demo.evaluate import fake_service
from osserve.demo.showcase import chat_tools
from osserve.demo.weights import DEMO_WEIGHTS
from osserve.engine.async_engine import AsyncEngine
from osserve.engine.load import EngineArgs, build_engine
from osserve.harmony.render import ChatMessage, render_chat
from osserve.model.card import model_card
from osserve.server.app import ServerConfig, create_app
from tests.server.serving import serve

MODEL = "osserve-demo"
GREEDY = {"temperature": 0, "num_predict": 200}
QUESTION = "What is 37 + 45?"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = expand_compact(DEMO_WEIGHTS, tmp_path_factory.mktemp("demo"))
    engine = AsyncEngine(build_engine(EngineArgs(model=str(folder), device="cpu", max_model_len=1024)))
    card = model_card(ModelConfig.from_pretrained(folder), folder, on_gpu=False)
    try:
        with serve(create_app(engine, engine.tokenizer, ServerConfig(model_name=MODEL, model_card=card))) as url:
            yield url
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def client(base: str) -> ollama.Client:
    return ollama.Client(host=base, timeout=120)


def prompt_tokens(question: str) -> int:
    return len(render_chat([ChatMessage("user", question)]).token_ids)


def check_durations(r: Any, prompt_len: int) -> None:
    assert r.done and r.done_reason == "stop"
    assert r.prompt_eval_count == prompt_len and r.eval_count > 1
    assert r.load_duration >= 0 and r.prompt_eval_duration > 0 and r.eval_duration > 0
    assert r.load_duration + r.prompt_eval_duration + r.eval_duration <= r.total_duration


def test_chat_with_thinking(client: ollama.Client) -> None:
    r = client.chat(model=MODEL, messages=[{"role": "user", "content": QUESTION}], think=True, options=GREEDY)
    assert "82" in r.message.content and r.message.thinking and "82" in r.message.thinking
    check_durations(r, prompt_tokens(QUESTION))
    hidden = client.chat(model=MODEL + ":latest", messages=[{"role": "user", "content": QUESTION}], think=False,
                         options={"temperature": 0, "num_predict": 12})  # 12 tokens of reasoning, not shown
    assert hidden.eval_count == 12 and not hidden.message.thinking and not hidden.message.content
    low, high = (client.chat(model=MODEL, messages=[{"role": "user", "content": QUESTION}], think=effort,
                             options=GREEDY) for effort in ("low", "high"))
    assert "82" in low.message.content and "82" in high.message.content
    assert len(low.message.thinking) < len(high.message.thinking)  # the demo reasons longer at high effort


def test_chat_streaming(client: ollama.Client) -> None:
    parts = list(client.chat(model=MODEL, messages=[{"role": "user", "content": QUESTION}], think=True,
                             stream=True, options=GREEDY))
    assert len(parts) > 3 and all(not p.done for p in parts[:-1])
    assert "82" in "".join(p.message.content or "" for p in parts)
    assert "".join(p.message.thinking or "" for p in parts)
    check_durations(parts[-1], prompt_tokens(QUESTION))
    assert parts[-1].eval_count >= len(parts) - 1  # a chunk carries one token's text or more


def test_chat_tool_round_trip(client: ollama.Client) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Paris?"}]
    tools = chat_tools([WEATHER_TOOL])
    r = client.chat(model=MODEL, messages=messages, tools=tools, options=GREEDY)
    call = r.message.tool_calls[0].function
    assert call.name == "get_weather" and dict(call.arguments) == {"city": "Paris"}
    result = fake_service(call.name, dict(call.arguments))
    messages += [{"role": "assistant", "content": "", "thinking": r.message.thinking,
                  "tool_calls": [{"function": {"name": call.name, "arguments": dict(call.arguments)}}]},
                 {"role": "tool", "content": json.dumps(result), "tool_name": call.name}]
    answer = client.chat(model=MODEL, messages=messages, tools=tools, options=GREEDY)
    assert str(result["temperature_c"]) in answer.message.content


def test_generate(client: ollama.Client) -> None:
    r = client.generate(model=MODEL, prompt=QUESTION, think=True, options=GREEDY)
    assert "82" in r.response and r.thinking
    check_durations(r, prompt_tokens(QUESTION))
    parts = list(client.generate(model=MODEL, prompt=QUESTION, stream=True, options={"num_predict": 3}))
    assert parts[-1].done and parts[-1].done_reason == "length" and parts[-1].eval_count == 3
    assert all(not p.done for p in parts[:-1])
    loaded = client.generate(model=MODEL, prompt="")
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""


def test_list_show_ps_version(client: ollama.Client, base: str) -> None:
    listed = client.list().models
    assert [m.model for m in listed] == [MODEL]
    details = listed[0].details
    assert details.family == "gptoss" and details.quantization_level == "MXFP4"
    assert details.parameter_size.endswith("M") and listed[0].size > 0 and len(listed[0].digest) == 64
    shown = client.show(MODEL)
    info = shown.modelinfo
    assert info["general.architecture"] == "gptoss" and info["gptoss.block_count"] == 4
    assert info["general.parameter_count"] > 0 and {"completion", "tools", "thinking"} <= set(shown.capabilities)
    running = client.ps().models[0]
    assert running.model == MODEL and running.size_vram == 0 and running.context_length == 1024
    assert running.expires_at > datetime.now(UTC)
    assert httpx.get(base + "/api/version").json() == {"version": __version__}


def test_unknown_model_is_a_404(client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="llama3", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 404
    with pytest.raises(ollama.ResponseError):
        client.show("llama3")
