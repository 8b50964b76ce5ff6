"""The engine end to end on the tiny checkpoint (CPU): batching never changes greedy outputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.engine import LLMEngine
from osserve.engine.load import EngineArgs, build_engine
from osserve.engine.warm_up import warm_up
from osserve.errors import ContextLengthError, InvalidRequestError

MAX_TOKENS = 12


def make_engine(ckpt: Path, **kw) -> LLMEngine:  # type: ignore[no-untyped-def]
    return build_engine(EngineArgs(model=str(ckpt), device="cpu", max_model_len=2048, **kw))


def prompts(n: int = 16, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 200, (n,), generator=g).tolist()
    return [torch.randint(0, 199_000, (n_,), generator=g).tolist() for n_ in lengths]


def run(engine: LLMEngine, ps: list[list[int]], params: SamplingParams, stagger: int = 0) -> dict[str, list[int]]:
    """Submit (one new request every `stagger` steps, or all at once) and collect token ids."""
    out: dict[str, list[int]] = {}
    pending = [(f"r{i}", p) for i, p in enumerate(ps)]
    steps = 0
    while pending or engine.has_unfinished():
        if pending and (stagger == 0 or steps % stagger == 0):
            batch = pending if stagger == 0 else pending[:1]
            for rid, p in batch:
                engine.add_request(rid, p, SamplingParams(**vars(params)))
            pending = pending[len(batch):]
        for d in engine.step():
            out.setdefault(d.request_id, []).extend(d.new_token_ids)
        steps += 1
    return out


@pytest.fixture(scope="module")
def engine(tiny_checkpoint: Path) -> LLMEngine:
    return make_engine(tiny_checkpoint)


@pytest.fixture(scope="module")
def alone(engine: LLMEngine) -> dict[str, list[int]]:
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return {f"r{i}": run(engine, [p], params)["r0"] for i, p in enumerate(prompts())}


GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)


def test_batched_equals_alone(engine: LLMEngine, alone: dict[str, list[int]]) -> None:
    assert run(engine, prompts(), GREEDY) == alone
    assert all(len(v) == MAX_TOKENS for v in alone.values())


def test_staggered_equals_alone(engine: LLMEngine, alone: dict[str, list[int]]) -> None:
    assert run(engine, prompts(), GREEDY, stagger=3) == alone


def test_warm_up_leaves_nothing_behind(tiny_checkpoint: Path, alone: dict[str, list[int]]) -> None:
    """warm_up (run before serving on a GPU) leaves no request, no counts, every block free, and
    outputs unchanged. A small budget makes its first prompt fill a whole step."""
    eng = make_engine(tiny_checkpoint, max_num_batched_tokens=64)
    warm_up(eng)
    stats = eng.stats()
    assert not eng.has_unfinished() and eng.in_flight is None
    assert stats.prompt_tokens_total == stats.generation_tokens_total == stats.prefix_cache_queries == 0
    assert stats.num_free_blocks == stats.num_total_blocks and eng.profile.steps == 0
    assert not eng.grammars.states and len(eng.grammars.compiler._cache) == 1  # the JSON-object grammar, built ahead
    assert run(eng, prompts(), GREEDY) == alone


def record_step_lengths(eng: LLMEngine) -> list[list[int]]:
    """The list each step's query lengths (one per sequence) are appended to, as the runner gets them."""
    steps: list[list[int]] = []
    run_step = eng.runner.run
    eng.runner.run = lambda entries, *a, **k: steps.append([len(e.token_ids) for e in entries]) or run_step(  # type: ignore[method-assign]
        entries, *a, **k)
    return steps


def test_warm_up_runs_an_eager_mixed_step(tiny_checkpoint: Path) -> None:
    """The warm-up's second step runs decodes beside a prompt longer than any mixed-step graph
    takes (mixed_graphs.QUERY_BUCKETS), so on a GPU it launches, and compiles, attention's split of a
    mixed batch before the first users' steps need it."""
    from osserve.engine.worker.mixed_graphs import QUERY_BUCKETS

    eng = make_engine(tiny_checkpoint)
    steps = record_step_lengths(eng)
    warm_up(eng)
    assert any(1 in lens and max(lens) > QUERY_BUCKETS[-1] for lens in steps), steps


def test_warm_up_fills_a_step_past_one_context(tiny_checkpoint: Path) -> None:
    """Where the step budget holds more than one context, the warm-up's first step fills it with
    several prompts (on a GPU: above 4096 tokens the dense MoE path, which a burst of long prompts
    takes), none longer than a context."""
    eng = build_engine(EngineArgs(model=str(tiny_checkpoint), device="cpu", max_model_len=300,
                                  max_num_batched_tokens=1024))
    steps = record_step_lengths(eng)
    warm_up(eng)
    first = next(lens for lens in steps if max(lens) > 41)  # after the JSON-bound prompt of each mask lane
    assert sum(first) == 1024 and max(first) == 298 and first.count(298) == 2, steps
    assert not eng.has_unfinished()


def test_warm_up_masks_more_rows_than_the_small_batch_head(tiny_checkpoint: Path) -> None:
    """The warm-up's mixed step samples more rows than the small-batch logits kernel takes, most of
    them under a JSON grammar's mask: on a GPU the mask kernel then meets bf16 logits, as a
    schema-bound serving batch does, not only float32 (compile_log.py warned of it after start-up)."""
    from osserve.ops.linear.small_m_triton import MAX_TOKENS as SMALL_M_TOKENS

    eng = make_engine(tiny_checkpoint, max_num_seqs=64)
    sampled: list[tuple[int, int]] = []  # (rows, masked rows) a step
    launch = eng._launch_sample

    def record(rows, logits, greedy, token_masks=None):  # type: ignore[no-untyped-def]
        sampled.append((len(rows), len(token_masks[0]) if token_masks is not None else 0))
        return launch(rows, logits, greedy, token_masks)

    eng._launch_sample = record  # type: ignore[method-assign]
    warm_up(eng)
    assert any(rows > SMALL_M_TOKENS and masked > SMALL_M_TOKENS // 2 for rows, masked in sampled), sampled


def test_tiny_chunks_equal_alone(tiny_checkpoint: Path, alone: dict[str, list[int]]) -> None:
    eng = make_engine(tiny_checkpoint, max_num_batched_tokens=7, no_prefix_caching=True)
    assert run(eng, prompts(), GREEDY) == alone


def test_preemption_keeps_outputs(tiny_checkpoint: Path, alone: dict[str, list[int]]) -> None:
    eng = make_engine(tiny_checkpoint, num_blocks=40, no_prefix_caching=True)
    assert run(eng, prompts(), GREEDY) == alone
    assert eng.scheduler.num_preemptions > 0
    assert all(eng.kv.num_free_blocks(g) == eng.kv.num_blocks(g) for g in eng.kv.groups)


def run_counting_cache(eng: LLMEngine, prompt: list[int]) -> tuple[list[int], int | None, int]:
    """One greedy request alone: (its tokens, its prompt tokens found in the cache, the prompt
    tokens the engine computed for it)."""
    before = eng.prompt_tokens_total
    eng.add_request("counted", prompt, SamplingParams(**vars(GREEDY)))
    out: list[int] = []
    cached = None
    while eng.has_unfinished():
        for d in eng.step():
            out.extend(d.new_token_ids)
            cached = d.num_cached_tokens
    return out, cached, eng.prompt_tokens_total - before


def test_prefix_cache_prefills_only_new_tokens(tiny_checkpoint: Path) -> None:
    eng = make_engine(tiny_checkpoint)
    shared = prompts(1, seed=5)[0] + prompts(1, seed=6)[0] + prompts(1, seed=7)[0]
    shared = (shared * 3)[:300]
    first, second = shared + [11, 12, 13], shared + [21, 22, 23, 24]
    run(eng, [first], GREEDY)
    out, cached, computed = run_counting_cache(eng, second)
    assert cached == 288  # 18 full blocks of 16 of the shared 300 tokens
    assert computed == len(second) - 288
    ref = make_engine(tiny_checkpoint, no_prefix_caching=True)
    assert out == run(ref, [second], GREEDY)["r0"]


@pytest.mark.parametrize("length", [63, 64])
def test_a_repeated_prompt_computes_only_its_last_token(tiny_checkpoint: Path, length: int) -> None:
    """The second request takes the cached full blocks and a copy of the prompt's last block
    (kv_cache.py): its output must be the output of a run without any cache."""
    eng = make_engine(tiny_checkpoint)
    prompt = ((prompts(1, seed=5)[0] + prompts(1, seed=6)[0]) * 4)[:length]
    first = run(eng, [prompt], GREEDY)["r0"]
    out, cached, computed = run_counting_cache(eng, prompt)
    assert cached == length - 1 and computed == 1
    ref = make_engine(tiny_checkpoint, no_prefix_caching=True)
    assert out == first == run(ref, [prompt], GREEDY)["r0"]


@pytest.mark.parametrize("async_prefill", [False, True])
def test_a_repeated_prompt_joins_beside_the_step_in_flight(tiny_checkpoint: Path, async_prefill: bool) -> None:
    """Newcomers that compute only their last token are launched like decodes, while the step
    before is still in flight; a newcomer with a prefill is too with async prefill, else it waits
    for that step (async scheduling)."""
    eng = make_engine(tiny_checkpoint, no_async_prefill=not async_prefill)
    prompt = ((prompts(1, seed=5)[0] + prompts(1, seed=6)[0]) * 4)[:63]
    first = run(eng, [prompt], GREEDY)["r0"]
    out: dict[str, list[int]] = {}

    def step() -> None:
        for d in eng.step():
            out.setdefault(d.request_id, []).extend(d.new_token_ids)

    eng.add_request("other", prompts(1, seed=7)[0], SamplingParams(**vars(GREEDY)))
    step()
    step()
    assert eng.in_flight is not None
    for i in range(3):
        eng.add_request(f"copy{i}", prompt, SamplingParams(**vars(GREEDY)))
    step()
    assert eng.in_flight is not None and {"copy0", "copy1", "copy2"} <= set(eng.in_flight.rows)
    eng.add_request("fresh", prompts(1, seed=8)[0], SamplingParams(**vars(GREEDY)))
    step()
    if async_prefill:  # launched beside the step in flight, and left in flight in turn
        assert eng.in_flight is not None and "fresh" in eng.in_flight.rows
    else:
        assert eng.in_flight is None  # the step in flight was finished first: nothing launched beside it
    while eng.has_unfinished():
        step()
    assert eng.profile.prefills_beside == async_prefill  # "fresh"'s, counted once it was read
    assert all(out[f"copy{i}"] == first for i in range(3))
    ref = make_engine(tiny_checkpoint, no_prefix_caching=True)
    assert out["fresh"] == run(ref, [prompts(1, seed=8)[0]], GREEDY)["r0"]


def test_seeded_sampling_reproducible_alone_and_in_batch(engine: LLMEngine) -> None:
    p = prompts(3, seed=9)
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=MAX_TOKENS, ignore_eos=True)
    a = run(engine, [p[0]], seeded)["r0"]
    engine.add_request("x", p[1], SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS))
    b = run(engine, [p[2], p[0]], seeded)["r1"]
    c = run(engine, [p[0]], SamplingParams(**{**vars(seeded), "seed": 99}))["r0"]
    assert a == b and a != c


def test_stop_string_spanning_two_tokens(engine: LLMEngine) -> None:
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    engine.add_request("s0", prompts(1, seed=3)[0], SamplingParams(**vars(params)))
    deltas = []
    while engine.has_unfinished():
        deltas += engine.step()
    ids = [t for d in deltas for t in d.new_token_ids]
    tok = engine.tokenizer
    # A stop string made of the end of token 3 and the start of token 4 of the free run.
    a, b = tok.decode([ids[3]]), tok.decode([ids[4]])
    stop = a[-2:] + b[:2]
    expected_text = tok.decode(ids[:5])
    expected_text = expected_text[: expected_text.find(stop)]
    engine.add_request("s1", prompts(1, seed=3)[0], SamplingParams(**{**vars(params), "stop": [stop]}))
    deltas = []
    while engine.has_unfinished():
        deltas += engine.step()
    assert "".join(d.new_text for d in deltas) == expected_text
    assert deltas[-1].finish_reason == "stop" and deltas[-1].stop_reason == stop
    assert all(engine.kv.num_free_blocks(g) == engine.kv.num_blocks(g) for g in engine.kv.groups)


def test_abort_frees_every_block(tiny_checkpoint: Path) -> None:
    eng = make_engine(tiny_checkpoint, no_prefix_caching=True)
    for i, p in enumerate(prompts(4)):
        eng.add_request(f"a{i}", p, SamplingParams(temperature=0, max_tokens=50))
    for _ in range(3):
        eng.step()
    assert any(eng.kv.num_free_blocks(g) < eng.kv.num_blocks(g) for g in eng.kv.groups)
    assert eng.in_flight is not None  # the aborts land while a step runs
    for i in range(4):
        d = eng.abort(f"a{i}")
        assert d is not None and d.finish_reason == "abort"
    assert not eng.has_unfinished()
    assert all(eng.kv.num_free_blocks(g) == eng.kv.num_blocks(g) for g in eng.kv.groups)


def test_async_scheduling_changes_no_output(tiny_checkpoint: Path, alone: dict[str, list[int]]) -> None:
    """Steps left in flight (the next one scheduled on the device's tokens) give the same tokens
    as finishing every step first: greedy, with requests arriving mid-run, stopping on a stop
    token while the next step already runs, and ending at different max_tokens."""
    stop_token = alone["r3"][5]  # appears mid-output: r3 (at least) stops on it
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, stop_token_ids=[stop_token])
    results, profiles = [], []
    for run_ahead in (True, False):
        eng = make_engine(tiny_checkpoint, no_async_scheduling=not run_ahead)
        out = run(eng, prompts(), params, stagger=2)
        for i, p in enumerate(prompts(4, seed=11)):  # different lengths, all at once
            eng.add_request(f"m{i}", p, SamplingParams(temperature=0, max_tokens=3 + 2 * i, ignore_eos=True))
        while eng.has_unfinished():
            for d in eng.step():
                out.setdefault(d.request_id, []).extend(d.new_token_ids)
        results.append(out)
        profiles.append(eng.profile.steps_in_flight)
        assert all(eng.kv.num_free_blocks(g) == eng.kv.num_blocks(g) for g in eng.kv.groups)
    assert results[0] == results[1]
    assert results[0]["r3"] == alone["r3"][:6]
    assert [len(results[0][f"m{i}"]) for i in range(4)] == [3, 5, 7, 9]
    assert profiles[0] > 10 and profiles[1] == 0  # async really ran ahead; sync never did


@pytest.mark.parametrize(("budget", "num_blocks"), [(13, None), (64, None), (64, 40)])
def test_async_prefill_changes_no_output(tiny_checkpoint: Path, alone: dict[str, list[int]], budget: int,
                                         num_blocks: int | None) -> None:
    """Prompt chunks and newcomers launched beside the step in flight give the tokens of the
    other two ways (newcomers with a prefill waiting for that step; every step finished first):
    prompts in chunks of 13 or 64 tokens arriving every other step, and (40 blocks) a pool too
    small for them all, so that requests are preempted and recompute. Every block comes back."""
    results, beside = [], []
    for extra in ({}, {"no_async_prefill": True}, {"no_async_scheduling": True}):
        eng = make_engine(tiny_checkpoint, max_num_batched_tokens=budget, num_blocks=num_blocks,
                          no_prefix_caching=True, **extra)
        results.append(run(eng, prompts(), GREEDY, stagger=2))
        beside.append(eng.profile.prefills_beside)
        assert all(eng.kv.num_free_blocks(g) == eng.kv.num_blocks(g) for g in eng.kv.groups)
        if num_blocks is not None:
            assert eng.scheduler.num_preemptions > 0
    assert results[0] == results[1] == results[2] == alone
    assert beside[0] > 10 and beside[1] == beside[2] == 0


def test_requests_that_need_their_tokens_mix_with_async(tiny_checkpoint: Path) -> None:
    """Logprobs and penalties need each token on the host before the next is sampled: with such a
    request in the batch the engine finishes each step, and everyone's output is unchanged."""
    special = {"r1": {"logprobs": 2}, "r2": {"repetition_penalty": 1.3, "frequency_penalty": 0.5},
               "r3": {"min_tokens": 6}}
    results = []
    for run_ahead in (True, False):
        eng = make_engine(tiny_checkpoint, no_async_scheduling=not run_ahead)
        for i, p in enumerate(prompts(5, seed=21)):
            extra = special.get(f"r{i}", {})
            eng.add_request(f"r{i}", p, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, **extra))
        out: dict[str, list] = {}
        while eng.has_unfinished():
            for d in eng.step():
                out.setdefault(d.request_id, []).append((d.new_token_ids, d.new_logprobs))
        results.append(out)
    assert results[0] == results[1]
    assert all(lp is not None for _, lp in results[0]["r1"]) and all(lp is None for _, lp in results[0]["r0"])


@pytest.mark.parametrize(
    ("prompt", "params", "error", "field"),
    [
        ([], SamplingParams(), InvalidRequestError, "prompt"),
        ([1] * 2000, SamplingParams(max_tokens=100), ContextLengthError, "max_tokens"),
        ([1] * 3000, SamplingParams(max_tokens=1), ContextLengthError, "prompt"),
        ([1], SamplingParams(temperature=-1), InvalidRequestError, "temperature"),
        ([1], SamplingParams(top_p=0), InvalidRequestError, "top_p"),
        ([1], SamplingParams(top_p=1.5), InvalidRequestError, "top_p"),
        ([1], SamplingParams(top_k=-2), InvalidRequestError, "top_k"),
        ([1], SamplingParams(n=0), InvalidRequestError, "n"),
        ([1], SamplingParams(max_tokens=10**9), ContextLengthError, "max_tokens"),
        ([1, 10**7], SamplingParams(), InvalidRequestError, "prompt"),
        ([1, -5], SamplingParams(), InvalidRequestError, "prompt"),
    ],
)
def test_bad_input_is_rejected_before_scheduling(engine: LLMEngine, prompt, params, error, field) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error) as info:
        engine.add_request("bad", prompt, params)
    assert info.value.param == field
    assert not engine.has_unfinished() and engine.scheduler.num_waiting() == 0


def test_request_larger_than_the_pool_is_rejected_up_front(tiny_checkpoint: Path) -> None:
    eng = make_engine(tiny_checkpoint, num_blocks=10)  # 160 tokens per group
    with pytest.raises(ContextLengthError, match="never fit"):
        eng.add_request("big", [1] * 150, SamplingParams(max_tokens=50))
