"""The server on the real tiny checkpoint: the whole path, model included."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI, OpenAI

from osserve.engine.async_engine import AsyncEngine
from osserve.engine.load import EngineArgs, build_engine
from osserve.server.app import ServerConfig, create_app
from tests.server.serving import serve

MODEL = "tiny"


@pytest.fixture(scope="module")
def engine(tiny_checkpoint: Path) -> Iterator[AsyncEngine]:
    eng = AsyncEngine(build_engine(EngineArgs(model=str(tiny_checkpoint), device="cpu", max_model_len=2048)))
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def base(engine: AsyncEngine) -> Iterator[str]:
    with serve(create_app(engine, engine.tokenizer, ServerConfig(model_name=MODEL))) as url:
        yield url


def all_blocks_free(engine: AsyncEngine) -> bool:
    kv = engine.engine.kv
    return all(kv.num_free_blocks(g) == kv.num_blocks(g) for g in kv.groups)


def test_chat_plain_and_streaming_agree(base: str) -> None:
    c = OpenAI(base_url=base + "/v1", api_key="x")
    msgs = [{"role": "user", "content": "Tell me a story."}]
    r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=16, temperature=0)
    assert r.usage.completion_tokens == 16 and r.choices[0].finish_reason == "length"
    streamed = list(c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=16, temperature=0,
                                              stream=True, stream_options={"include_usage": True}))
    text = "".join((ch.choices[0].delta.content or "") + (getattr(ch.choices[0].delta, "reasoning", None) or "")
                   for ch in streamed if ch.choices)
    m = r.choices[0].message
    assert text == (m.reasoning or "") + (m.content or "") or text == (m.content or "") + (m.reasoning or "")
    assert streamed[-1].usage.prompt_tokens_details.cached_tokens > 0  # the same prompt again


def test_seeded_n_and_completions(base: str) -> None:
    c = OpenAI(base_url=base + "/v1", api_key="x")
    r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                                  n=3, seed=7, temperature=1.0)
    assert len(r.choices) == 3 and r.usage.completion_tokens == 24
    r2 = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8,
                                   n=3, seed=7, temperature=1.0)
    assert [x.message.content for x in r.choices] == [x.message.content for x in r2.choices]
    comp = c.completions.create(model=MODEL, prompt="Once upon", max_tokens=6, temperature=0, logprobs=3)
    assert len(comp.choices[0].logprobs.tokens) == 6
    assert all(len(t) == 3 for t in comp.choices[0].logprobs.top_logprobs)


def test_responses_and_ollama(base: str) -> None:
    c = OpenAI(base_url=base + "/v1", api_key="x")
    r = c.responses.create(model=MODEL, input="hello", max_output_tokens=8)
    assert r.usage.output_tokens == 8 and r.status == "incomplete"
    r2 = c.responses.create(model=MODEL, input="again", max_output_tokens=4, previous_response_id=r.id)
    assert r2.usage.input_tokens > r.usage.input_tokens
    lines = httpx.post(base + "/api/generate", json={"model": MODEL, "prompt": "hi",
                                                     "options": {"num_predict": 5}}).text.splitlines()
    assert '"done": true' in lines[-1]


def test_concurrent_requests(base: str) -> None:
    async def run() -> list[int]:
        c = AsyncOpenAI(base_url=base + "/v1", api_key="x")
        rs = await asyncio.gather(*[
            c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"q{i}"}],
                                      max_tokens=6, temperature=0) for i in range(8)])
        return [r.usage.completion_tokens for r in rs]
    assert asyncio.run(run()) == [6] * 8


def test_disconnect_frees_blocks(base: str, engine: AsyncEngine) -> None:
    with httpx.stream("POST", base + "/v1/chat/completions", json={
            "model": MODEL, "stream": True, "max_tokens": 1000, "ignore_eos": True,
            "messages": [{"role": "user", "content": "go on forever"}]}) as resp:
        for i, _ in enumerate(resp.iter_lines()):
            if i > 4:
                break
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (engine.engine.has_unfinished() or not all_blocks_free(engine)):
        time.sleep(0.05)
    assert not engine.engine.has_unfinished() and all_blocks_free(engine)


def test_metrics_from_the_engine(base: str) -> None:
    text = httpx.get(base + "/metrics").text
    gen = [line for line in text.splitlines() if line.startswith("osserve:generation_tokens_total")]
    assert gen and float(gen[0].split()[-1]) > 0
    assert 'osserve:prefix_cache_hits_total{model_name="tiny"}' in text
