"""Decode-first scheduling (engine/core/decode_first.py): the prompt tokens a step may take beside its
decodes; the scheduler holding prompts to that while decodes step every step, no request starving,
outputs unchanged (a fake model, then the tiny checkpoint on the CPU); the flags, and the default
step budget picked from the card's memory."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from osserve import cli
from osserve.commands.flags import prepare_argv, settle
from osserve.config import CacheConfig, SchedulerConfig, preset
from osserve.engine.core.decode_first import describe, prefill_allowance
from osserve.engine.core.kv_cache import KVCacheManager
from osserve.engine.core.request import Request
from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.core.scheduler import Scheduler, SchedulerOutput
from osserve.engine.engine import LLMEngine
from osserve.engine.load import EngineArgs, build_engine, scheduler_config
from osserve.engine.memory import BATCHED_TOKENS, LARGE_BATCHED_TOKENS, GiB, default_batched_tokens
from osserve.errors import ConfigError
from osserve.unsupported import refusals
from tests.engine.test_scheduler import GROUPS, fake_next

# ------------------------------------------------------------------------------------ the rule


@pytest.mark.parametrize("budget,decode_tokens,decodes,chunk,min_decodes,allowed", [
    (8192, 0, 0, 2048, 32, 8192),  # nothing decoding: the whole step
    (8192, 31, 31, 2048, 32, 8161),  # few decoding: what they leave
    (8192, 32, 32, 2048, 32, 2048),  # many: the chunk
    (8192, 256, 256, 2048, 32, 2048),
    (16384, 256, 256, 4096, 32, 4096),
    (2048, 256, 256, 4096, 32, 1792),  # a chunk larger than the room: the room
    (300, 300, 300, 64, 1, 0),  # the decodes fill the step: nothing is left for a prompt
    (8192, 40, 10, 2048, 8, 2048),  # drafts count as decode tokens, requests as decodes
    (8192, 40, 10, 2048, 16, 8152),
    (8192, 256, 256, 0, 32, 8192),  # off: the whole budget, shared in arrival order
    (8192, 0, 0, 0, 1, 8192),
])
def test_prefill_allowance(budget: int, decode_tokens: int, decodes: int, chunk: int, min_decodes: int,
                           allowed: int) -> None:
    assert prefill_allowance(budget, decode_tokens, decodes, chunk, min_decodes) == allowed


def test_the_allowance_never_grows_with_more_decodes_and_never_starves() -> None:
    """More decodes never allow more prompt tokens, and while the decodes leave room, some is allowed."""
    for chunk in (1, 7, 64, 2048):
        for min_decodes in (1, 5, 32):
            before = None
            for d in range(0, 300):
                a = prefill_allowance(512, d, d, chunk, min_decodes)
                assert a <= 512 - d and (a > 0 or d >= 512)
                assert before is None or a <= before
                before = a


def test_describe() -> None:
    assert describe(2048, 32, 16384) == ("decode-first: at most 2,048 prompt tokens a step while 32+ requests "
                                         "decode, else up to 16,384")
    assert "off" in describe(0, 32, 8192)


@pytest.mark.parametrize("field,value", [("decode_first_chunk", -1), ("decode_first_min_decodes", 0),
                                         ("max_num_batched_tokens", 0), ("max_model_len", 2)])
def test_bad_settings_are_refused_by_name(field: str, value: int) -> None:
    with pytest.raises(ConfigError) as e:
        SchedulerConfig(**{field: value})  # type: ignore[arg-type]
    assert e.value.param == field and "--" + field.replace("_", "-") in e.value.message


# ----------------------------------------------------------------------------- the scheduler


def scheduler(budget: int, chunk: int, min_decodes: int, num_blocks: int = 400, max_seqs: int = 32) -> Scheduler:
    kv = KVCacheManager(16, num_blocks, GROUPS, enable_prefix_caching=False)
    return Scheduler(SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget, max_model_len=4096,
                                     decode_first_chunk=chunk, decode_first_min_decodes=min_decodes), kv)


def request(rid: str, length: int, max_tokens: int, seed: int = 0) -> Request:
    rng = random.Random(f"{rid}-{seed}")
    return Request(rid, [rng.randrange(1000) for _ in range(length)],
                   SamplingParams(max_tokens=max_tokens, ignore_eos=True), 0.0)


def expected_output(r: Request) -> list[int]:
    toks = list(r.prompt_token_ids)
    for _ in range(r.sampling_params.max_tokens or 0):
        toks.append(fake_next(toks))
    return toks[len(r.prompt_token_ids):]


def step(s: Scheduler, out: SchedulerOutput) -> None:
    sampled = {x.request_id: fake_next(s.requests[x.request_id].token_slice(0, x.start + x.num_new_tokens))
               for x in out.scheduled if x.needs_sample}
    s.update_from_output(out, sampled)


def decoding(s: Scheduler) -> set[str]:
    return {r.request_id for r in s.running if r.num_tokens - r.num_computed_tokens == 1}


def prompt_tokens(out: SchedulerOutput, before: set[str]) -> int:
    return sum(x.num_new_tokens for x in out.scheduled if x.request_id not in before)


def test_a_long_prompt_is_chunked_beside_many_decodes_which_step_every_step() -> None:
    s = scheduler(budget=512, chunk=48, min_decodes=8)
    short = [request(f"d{i}", 5 + i, max_tokens=60) for i in range(12)]
    for r in short:
        s.add_request(r)
    step(s, s.schedule())  # every short prompt in one step
    assert decoding(s) == {r.request_id for r in short}
    long = request("long", 700, max_tokens=4)
    s.add_request(long)
    chunks = []
    while long.num_computed_tokens < len(long.prompt_token_ids):
        before = decoding(s)
        out = s.schedule()
        sizes = {x.request_id: x.num_new_tokens for x in out.scheduled}
        assert before <= sizes.keys() and all(sizes[rid] == 1 for rid in before)  # every decode steps
        chunks.append(sizes["long"])
        step(s, out)
    assert max(chunks) <= 48 and all(c > 0 for c in chunks) and sum(chunks) == 700
    assert len(chunks) == -(-700 // 48)
    while s.running or s.waiting:
        step(s, s.schedule())
    assert long.output_token_ids == expected_output(long)
    assert all(r.output_token_ids == expected_output(r) for r in short)


def test_with_few_decodes_a_prompt_takes_what_they_leave() -> None:
    s = scheduler(budget=512, chunk=48, min_decodes=8)
    few = [request(f"d{i}", 5, max_tokens=30) for i in range(3)]
    for r in few:
        s.add_request(r)
    step(s, s.schedule())
    s.add_request(request("long", 700, max_tokens=4))
    out = s.schedule()
    assert {x.request_id: x.num_new_tokens for x in out.scheduled}["long"] == 512 - 3


def test_decodes_come_first_whatever_the_running_order() -> None:
    """The decodes' tokens are set aside before any prompt chunk is scheduled, so a prompt chunk
    ahead of them in the running order cannot take their place; with the rule off the running order
    decides, as before. (First come, first served puts a prompt still chunking last in the order:
    the order is turned round by hand here.)"""
    def run(chunk: int) -> dict[str, int]:
        s = scheduler(budget=64, chunk=chunk, min_decodes=1000)  # never enough decodes for the chunk
        for i in range(6):
            s.add_request(request(f"d{i}", 1, max_tokens=20))
        step(s, s.schedule())
        s.add_request(request("long", 400, max_tokens=4))
        step(s, s.schedule())  # 58 of its tokens beside the six decodes
        s.running.insert(0, s.running.pop())
        return {x.request_id: x.num_new_tokens for x in s.schedule().scheduled}

    on, off = run(chunk=2048), run(chunk=0)
    assert on == {"long": 64 - 6, **{f"d{i}": 1 for i in range(6)}}
    assert off == {"long": 64}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("chunk,min_decodes,num_blocks", [(16, 1, 400), (37, 4, 400), (64, 2, 32), (0, 1, 32)])
def test_random_arrivals_all_finish_with_their_outputs(seed: int, chunk: int, min_decodes: int,
                                                       num_blocks: int) -> None:
    """Requests of random lengths arriving at random steps, a small pool (preemptions) or a large one:
    every one finishes with the outputs it would have alone, and in every step where a prompt waits
    for tokens and the decodes leave room, some prompt gets them (no starvation)."""
    rng = random.Random(seed)
    s = scheduler(budget=96, chunk=chunk, min_decodes=min_decodes, num_blocks=num_blocks, max_seqs=10)
    arrivals = sorted(((rng.randrange(60), request(f"r{i}", rng.choice([1, 9, 40, 150, 300]), rng.randrange(1, 30),
                                                   seed)) for i in range(24)), key=lambda a: a[0])
    everyone = [r for _, r in arrivals]
    t = 0
    while arrivals or s.running or s.waiting:
        while arrivals and arrivals[0][0] <= t:
            s.add_request(arrivals.pop(0)[1])
        before = decoding(s)
        # A prompt wants tokens and could take them (the pool is ample: no admission waits for blocks).
        want = any(r.num_tokens - r.num_computed_tokens > 1 for r in s.running) or (
            bool(s.waiting) and len(s.running) < 10)
        out = s.schedule()
        if chunk and want and num_blocks == 400:
            assert prompt_tokens(out, before) > 0
        if chunk and len(before) >= min_decodes:
            assert prompt_tokens(out, before) <= chunk
        step(s, out)
        t += 1
        assert t < 5000
    assert all(r.output_token_ids == expected_output(r) for r in everyone)
    if num_blocks == 32:
        assert s.num_preemptions > 0


# ------------------------------------------------------------------- the engine (tiny, CPU)


def record_steps(eng: LLMEngine) -> list[tuple[set[str], dict[str, int]]]:
    """Each step: the requests decoding (and not sitting it out) before it, and what it scheduled."""
    sched = eng.scheduler
    real = sched.schedule
    steps: list[tuple[set[str], dict[str, int]]] = []

    def schedule(skip=(), lookahead: int = 0) -> SchedulerOutput:  # type: ignore[no-untyped-def]
        before = {rid for rid in decoding(sched) if rid not in skip}
        out = real(skip, lookahead)
        steps.append((before, {x.request_id: x.num_new_tokens for x in out.scheduled}))
        return out

    sched.schedule = schedule  # type: ignore[method-assign]
    return steps


def serve_a_long_prompt_beside_decodes(eng: LLMEngine) -> dict[str, list[int]]:
    """Ten short greedy requests start decoding; then a 256-token prompt arrives."""
    g = torch.Generator().manual_seed(3)
    out: dict[str, list[int]] = {}
    greedy = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
    for i in range(10):
        eng.add_request(f"d{i}", torch.randint(0, 199_000, (8 + i,), generator=g).tolist(),
                        SamplingParams(**vars(greedy)))
    for _ in range(3):
        for d in eng.step():
            out.setdefault(d.request_id, []).extend(d.new_token_ids)
    eng.add_request("long", torch.randint(0, 199_000, (256,), generator=g).tolist(),
                    SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    while eng.has_unfinished():
        for d in eng.step():
            out.setdefault(d.request_id, []).extend(d.new_token_ids)
    return out


def tiny_engine(ckpt: Path, **kw) -> LLMEngine:  # type: ignore[no-untyped-def]
    return build_engine(EngineArgs(model=str(ckpt), device="cpu", max_model_len=2048, max_num_batched_tokens=512,
                                   num_blocks=200, **kw))


def test_the_engine_chunks_a_long_prompt_while_decodes_step_and_outputs_are_unchanged(tiny_checkpoint: Path) -> None:
    eng = tiny_engine(tiny_checkpoint, decode_first_chunk=32, decode_first_min_decodes=8)
    steps = record_steps(eng)
    on = serve_a_long_prompt_beside_decodes(eng)
    chunks = [(before, sizes) for before, sizes in steps if sizes.get("long", 0) > 1]
    assert len(chunks) == 256 // 32
    for before, sizes in chunks:
        assert sizes["long"] <= 32 and len(before) >= 8
        assert before <= sizes.keys() and all(sizes[rid] == 1 for rid in before)  # every decode stepped
    off_engine = tiny_engine(tiny_checkpoint, no_decode_first=True)
    off_steps = record_steps(off_engine)
    off = serve_a_long_prompt_beside_decodes(off_engine)
    assert max(sizes.get("long", 0) for _, sizes in off_steps) == 256  # without the rule: in one step
    assert on == off and len(on["long"]) == 4 and all(len(v) == 14 for k, v in on.items() if k != "long")


# ----------------------------------------------------------------------- flags and defaults


def engine_args(line: str) -> EngineArgs:
    args = cli.build_parser().parse_args(prepare_argv(["serve", *line.split()]))
    settle(args)
    return EngineArgs.from_namespace(args)


def cpu_sched(line: str) -> SchedulerConfig:
    return scheduler_config(engine_args(line), preset("tiny"), torch.device("cpu"), CacheConfig(), torch.float32)


def test_the_flags() -> None:
    default = cpu_sched("")  # a CPU's running set is 32 requests
    assert (default.max_num_seqs, default.decode_first_chunk, default.decode_first_min_decodes) == (32, 2048, 24)
    # The threshold is three quarters of the running set, at most 3/256 of the step budget (192 of
    # the 20b's 256 at 16,384 tokens a step on an 80 GB card, 96 at 8,192).
    assert [cpu_sched(f"--max-num-seqs {n}").decode_first_min_decodes for n in (256, 512, 1)] == [96, 96, 1]
    big = "--max-num-batched-tokens 16384 --max-num-seqs"
    assert [cpu_sched(f"{big} {n}").decode_first_min_decodes for n in (128, 256, 512)] == [96, 192, 192]
    assert cpu_sched("--max-num-batched-tokens 100").decode_first_min_decodes == 1
    assert SchedulerConfig().decode_first_min_decodes == 96
    assert cpu_sched("--max-num-seqs 512 --decode-first-min-decodes 32").decode_first_min_decodes == 32
    assert default.max_num_batched_tokens == BATCHED_TOKENS  # on a CPU
    s = cpu_sched("--decode-first-chunk 512 --decode-first-min-decodes 4")
    assert (s.decode_first_chunk, s.decode_first_min_decodes) == (512, 4)
    assert cpu_sched("--no-decode-first").decode_first_chunk == 0
    assert cpu_sched("--decode-first-chunk 0").decode_first_chunk == 0
    assert cpu_sched("--chunked-prefill-size 4096").max_num_batched_tokens == 4096  # SGLang's name
    with pytest.raises(ConfigError, match="--decode-first-min-decodes must be at least 1"):
        cpu_sched("--decode-first-min-decodes 0")


def test_peer_flags_are_refused_or_noted_with_what_osserve_does() -> None:
    args = cli.build_parser().parse_args(prepare_argv(["serve", "--long-prefill-token-threshold", "2048"]))
    assert refusals(args) == [
        "--long-prefill-token-threshold 2048: osserve caps a step's prompt tokens only while requests decode "
        "(decode-first): --decode-first-chunk 2048 (0: off; --decode-first-min-decodes M: from how many "
        "decoding requests)"]
    notes = settle(cli.build_parser().parse_args(prepare_argv(["serve", "--enable-mixed-chunk"])))
    assert notes == ["--enable-mixed-chunk: osserve always runs decodes beside prompt chunks in one step"]


H100, H200, A10, L40S = int(79.1 * GiB), int(139.8 * GiB), int(22.2 * GiB), int(44.4 * GiB)


@pytest.mark.parametrize("model,card,utilization,ranks,budget", [
    ("20b", H100, 0.90, 1, LARGE_BATCHED_TOKENS),  # 2 GiB is ~4% of its cache: the prefill goal's budget
    ("20b", H100, 0.97, 1, LARGE_BATCHED_TOKENS),
    ("120b", H100, 0.90, 1, BATCHED_TOKENS),  # its cache is small: every GiB is ~20k tokens
    ("120b", H100, 0.97, 1, BATCHED_TOKENS),
    ("120b", H200, 0.95, 1, BATCHED_TOKENS),  # no dense prefill path (one expert layout kept)
    ("20b", H200, 0.95, 1, LARGE_BATCHED_TOKENS),
    ("20b", A10, 0.90, 1, BATCHED_TOKENS),  # one expert layout, a small cache
    ("20b", L40S, 0.90, 1, BATCHED_TOKENS),  # 2 GiB is 14% of its cache
    ("120b", H100, 0.90, 8, LARGE_BATCHED_TOKENS),  # an eighth of the weights a card
])
def test_the_default_step_budget_follows_the_card(model: str, card: int, utilization: float, ranks: int,
                                                  budget: int) -> None:
    cache = CacheConfig(gpu_memory_utilization=utilization)
    assert default_batched_tokens(preset(model), cache, torch.bfloat16, card, ranks) == budget


def test_a_hand_sized_cache_keeps_the_smaller_budget() -> None:
    for cache in (CacheConfig(kv_cache_gb=40.0), CacheConfig(num_blocks=10_000)):
        assert default_batched_tokens(preset("20b"), cache, torch.bfloat16, H100) == BATCHED_TOKENS
