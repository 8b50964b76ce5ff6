"""`--kv-cache-dtype fp8` through the engine on the tiny checkpoint (CPU: the reference path, which
quantises every cache write and decodes every read, ops/attention/kv_format.py).

Two claims.
(1) Greedy outputs stay close to the unquantised cache's, measured teacher-forced along each FP8 run's
own tokens against the model's float32-KV logits (the margin of a token: how far below the reference's
best it is). The built-in trained model: every FP8 token is the reference's argmax. The tiny random
checkpoint: at least 75% are, and at least 90% are within 0.5 logits. Why these numbers: e4m3 keeps 3
mantissa bits (at most 2^-4 relative error a value, ~2.5% RMS, 16x bf16's); through the tiny model's
4 layers that moves its decode logits by ~4% of their norm (median, benchmarks/kv_fp8_accuracy.py),
~0.1 logits each at its logit spread of ~2. A choice flips only at a near-tie, and the random tiny
model is full of them: its median top-2 margin is 0.29 logits, and its random router has near-ties
too, whose flip swaps an expert and moves the logits by whole units (bf16 KV flips 2% of its tokens
for the same reason, by up to 0.7 logits; FP8 flips 19%, 4% by more than 0.5, measured 2026-11-25).
The trained model's margins are wide: nothing flips.
(2) FP8 changes nothing about scheduling. Each token's scale is its own (one per token and kv head,
from its own values), so what lands in the cache does not depend on the batch, the chunking or the
step: outputs batched, in 7-token chunks, preempted, from the prefix cache (its copied last block with
its scales) and staggered with or without async scheduling are exactly the FP8 run's alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.engine import LLMEngine
from osserve.engine.llm import LLM
from osserve.engine.worker.kv_tensors import layer_groups
from osserve.ops.attention.kv_format import FP8_DTYPE
from tests.engine.test_engine import GREEDY, make_engine, prompts, run, run_counting_cache
from tests.model.contiguous import ContiguousCache

FP8 = {"kv_cache_dtype": "fp8"}


@pytest.fixture(scope="module")
def fp8_engine(tiny_checkpoint: Path) -> LLMEngine:
    return make_engine(tiny_checkpoint, **FP8)


@pytest.fixture(scope="module")
def fp8_alone(fp8_engine: LLMEngine) -> dict[str, list[int]]:
    return {f"r{i}": run(fp8_engine, [p], GREEDY)["r0"] for i, p in enumerate(prompts())}


def test_the_cache_is_fp8_with_scales(fp8_engine: LLMEngine) -> None:
    for kv in fp8_engine.runner.kv_caches:
        assert kv.k.dtype == kv.v.dtype == FP8_DTYPE and kv.fp8
        assert kv.k_scales is not None and kv.k_scales.shape == kv.k.shape[:3]


def margins(engine: LLMEngine, ps: list[list[int]], outputs: list[list[int]]) -> torch.Tensor:
    """Each output token's margin: the model's float32-KV logits (teacher-forced), best minus chosen."""
    model = engine.runner.model
    found = []
    for prompt, tokens in zip(ps, outputs, strict=True):
        cache = ContiguousCache(model, 1, len(prompt) + len(tokens) + 1)  # the model's dtype, float32
        ids, pos, meta = cache.step([0], [prompt + tokens[:-1]])
        with torch.inference_mode():
            ref = model.compute_logits(model(ids, pos, meta, cache.kv))[len(prompt) - 1:]
        found.append(ref.max(1).values - ref.gather(1, torch.tensor(tokens)[:, None])[:, 0])
    return torch.cat(found)


def test_greedy_tokens_of_the_tiny_model_stay_near_the_unquantised(fp8_engine: LLMEngine,
                                                                  fp8_alone: dict[str, list[int]]) -> None:
    m = margins(fp8_engine, prompts(), [fp8_alone[f"r{i}"] for i in range(len(prompts()))])
    assert (m == 0).float().mean().item() >= 0.75
    assert (m <= 0.5).float().mean().item() >= 0.9


def test_the_trained_model_answers_as_with_the_unquantised_cache() -> None:
    from osserve.demo.evaluate import heldout_examples
    from osserve.harmony.render import render_chat

    llm = LLM(device="cpu", max_model_len=1024, kv_cache_dtype="fp8")  # the built-in model
    ps = [render_chat(ex.messages, tools=ex.tools, reasoning_effort=ex.effort).token_ids for ex in heldout_examples(3)]
    outs = [o.token_ids for o in llm.generate(ps, SamplingParams(temperature=0, max_tokens=40))]
    assert (margins(llm.engine, ps, outs) == 0).all()


def test_batching_and_chunking_change_no_output(tiny_checkpoint: Path, fp8_engine: LLMEngine,
                                                fp8_alone: dict[str, list[int]]) -> None:
    assert run(fp8_engine, prompts(), GREEDY) == fp8_alone
    chunked = make_engine(tiny_checkpoint, max_num_batched_tokens=7, no_prefix_caching=True, **FP8)
    assert run(chunked, prompts(), GREEDY) == fp8_alone


def test_preemption_keeps_outputs(tiny_checkpoint: Path, fp8_alone: dict[str, list[int]]) -> None:
    eng = make_engine(tiny_checkpoint, num_blocks=40, no_prefix_caching=True, **FP8)
    assert run(eng, prompts(), GREEDY) == fp8_alone
    assert eng.scheduler.num_preemptions > 0
    assert all(eng.kv.num_free_blocks(g) == eng.kv.num_blocks(g) for g in eng.kv.groups)


def test_the_prefix_cache_serves_blocks_and_copies_the_last_with_its_scales(tiny_checkpoint: Path) -> None:
    """A repeated 63-token prompt takes the cached full blocks and a copy of the last one (codes and
    scales), computes one token, and decodes exactly as a run without any cache."""
    eng = make_engine(tiny_checkpoint, **FP8)
    runner = eng.runner
    copied: list[str] = []
    copy_blocks = runner.copy_blocks

    def checked(copies):  # type: ignore[no-untyped-def]
        copy_blocks(copies)
        for c in copies:
            for layer in layer_groups(runner.model.config)[c.group]:
                tensors = runner.kv_caches[layer].tensors()
                assert len(tensors) == 4 and all(torch.equal(t[c.dst], t[c.src]) for t in tensors)
            copied.append(c.group)

    runner.copy_blocks = checked  # type: ignore[method-assign]
    prompt = ((prompts(1, seed=5)[0] + prompts(1, seed=6)[0]) * 4)[:63]
    first = run(eng, [prompt], GREEDY)["r0"]
    out, cached, computed = run_counting_cache(eng, prompt)
    assert cached == 62 and computed == 1 and copied
    ref = make_engine(tiny_checkpoint, no_prefix_caching=True, **FP8)
    assert out == first == run(ref, [prompt], GREEDY)["r0"]


def test_async_scheduling_changes_no_output(tiny_checkpoint: Path, fp8_alone: dict[str, list[int]]) -> None:
    """Steps left in flight, and newcomers' prefills launched beside them (async prefill), write
    and read the FP8 cache as synchronous steps do."""
    results, in_flight, beside = [], [], []
    for run_ahead in (True, False):
        eng = make_engine(tiny_checkpoint, no_async_scheduling=not run_ahead, **FP8)
        results.append(run(eng, prompts(), GREEDY, stagger=2))
        in_flight.append(eng.profile.steps_in_flight)
        beside.append(eng.profile.prefills_beside)
    assert results[0] == results[1] == fp8_alone
    assert in_flight[0] > 10 and in_flight[1] == 0
    assert beside[0] > 5 and beside[1] == 0


def test_the_offline_llm_takes_the_flag(tiny_checkpoint: Path, fp8_alone: dict[str, list[int]]) -> None:
    llm = LLM(model=str(tiny_checkpoint), device="cpu", max_model_len=2048, kv_cache_dtype="fp8")
    assert all(kv.fp8 for kv in llm.engine.runner.kv_caches)
    out = llm.generate([prompts()[0]], GREEDY)[0]
    assert out.token_ids == fp8_alone["r0"]


def test_gpus_without_e4m3_conversions_are_refused_at_start() -> None:
    """Triton converts e4m3 on compute capability 8.9 and later; an A100 or A10 gets one line, not a
    kernel that fails to compile mid-warm-up. The CPU (the reference path) takes it."""
    from osserve.engine.load import refuse_fp8_kv_where_unsupported
    from osserve.errors import ConfigError
    from osserve.ops.policy import decide

    for capability in ((8, 0), (8, 6)):
        with pytest.raises(ConfigError, match=r"--kv-cache-dtype fp8 needs an NVIDIA GPU of compute capability 8\.9"):
            refuse_fp8_kv_where_unsupported(FP8_DTYPE, decide(capability), "fp8")
    for capability in ((8, 9), (9, 0), (10, 0), None):
        refuse_fp8_kv_where_unsupported(FP8_DTYPE, decide(capability), "fp8")
    refuse_fp8_kv_where_unsupported(torch.bfloat16, decide((8, 0)), "auto")
