"""`--stream-interval N` (vLLM's): after the first token, the deltas a request streams are joined
until they hold N tokens, or the last one comes; 1 hands every delta on."""

from __future__ import annotations

import asyncio

from osserve.engine.core.outputs import CompletionDelta
from osserve.engine.core.sampling_params import SamplingParams
from osserve.server.app import ServerConfig, create_app
from osserve.server.generation import generate
from osserve.tokenizer import load_tokenizer
from tests.server.stub_engine import ScriptedEngine


def deltas(interval: int, n_tokens: int) -> list[CompletionDelta]:
    tokens = load_tokenizer().encode(" word" * n_tokens)
    engine = ScriptedEngine(tokens)  # one token a delta
    state = create_app(engine, load_tokenizer(), ServerConfig(model_name="m", stream_interval=interval)).state.osserve

    async def run() -> list[CompletionDelta]:
        return [d async for d in generate(state, [1, 2, 3], SamplingParams(max_tokens=n_tokens), "r")]

    return asyncio.run(run())


def test_stream_interval_joins_deltas_after_the_first_token() -> None:
    out = deltas(4, 10)
    assert [len(d.new_token_ids) for d in out] == [1, 4, 4, 1]
    assert "".join(d.new_text for d in out) == " word" * 10
    assert out[-1].finished and [d.finished for d in out[:-1]] == [False] * 3
    assert out[-1].num_output_tokens == 10
    assert [len(d.new_token_ids) for d in deltas(1, 5)] == [1] * 5
