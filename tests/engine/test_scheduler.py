"""Scheduler without a model: budgets, chunking, caps, preemption and abort, with a fake model
whose next token is a function of the last one."""

from __future__ import annotations

import pytest

from osserve.config import SchedulerConfig
from osserve.engine.core.kv_cache import KVCacheManager
from osserve.engine.core.request import Request, RequestStatus
from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.core.scheduler import Scheduler

GROUPS = [("sliding", 128), ("full", None)]


def fake_next(tokens: list[int]) -> int:
    return (tokens[-1] * 31 + 7) % 1000


def make(num_blocks: int = 200, budget: int = 64, max_seqs: int = 8) -> Scheduler:
    kv = KVCacheManager(16, num_blocks, GROUPS, enable_prefix_caching=False)
    return Scheduler(SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget,
                                     max_model_len=4096), kv)


def drive(s: Scheduler, reqs: list[Request], check=None) -> dict[str, list[int]]:  # type: ignore[no-untyped-def]
    for r in reqs:
        s.add_request(r)
    while s.running or s.waiting:
        out = s.schedule()
        if check:
            check(s, out)
        sampled = {x.request_id: fake_next(s.requests[x.request_id].token_slice(0, x.start + x.num_new_tokens))
                   for x in out.scheduled if x.needs_sample}
        s.update_from_output(out, sampled)
    return {r.request_id: r.output_token_ids for r in reqs}


def reqs(lengths: list[int], max_tokens: int = 10) -> list[Request]:
    return [Request(f"r{i}", list(range(i, i + n)), SamplingParams(max_tokens=max_tokens, ignore_eos=True), 0.0)
            for i, n in enumerate(lengths)]


LENGTHS = [5, 100, 37, 250, 1, 64, 300, 17]


def expected(lengths: list[int], max_tokens: int = 10) -> dict[str, list[int]]:
    out = {}
    for r in reqs(lengths, max_tokens):
        toks = list(r.prompt_token_ids)
        for _ in range(max_tokens):
            toks.append(fake_next(toks))
        out[r.request_id] = toks[len(r.prompt_token_ids):]
    return out


def test_budget_and_cap_respected_and_outputs_right() -> None:
    def check(s: Scheduler, out) -> None:  # type: ignore[no-untyped-def]
        assert out.num_batched_tokens <= 64
        assert len(s.running) <= 3
    s = make(budget=64, max_seqs=3)
    assert drive(s, reqs(LENGTHS), check) == expected(LENGTHS)


def test_chunked_prefill_mixes_with_decodes() -> None:
    seen_mixed = []

    def check(s: Scheduler, out) -> None:  # type: ignore[no-untyped-def]
        sizes = [x.num_new_tokens for x in out.scheduled]
        seen_mixed.append(1 in sizes and any(n > 1 for n in sizes))
    s = make(budget=7)
    assert drive(s, reqs(LENGTHS), check) == expected(LENGTHS)
    assert any(seen_mixed)


def test_preemption_by_recompute() -> None:
    s = make(num_blocks=30, budget=512)
    assert drive(s, reqs(LENGTHS, max_tokens=40), None) == expected(LENGTHS, 40)
    assert s.num_preemptions > 0
    assert all(s.kv.num_free_blocks(g) == 30 for g in s.kv.groups)


def test_abort_anywhere_frees_blocks() -> None:
    s = make(budget=100)
    rs = reqs(LENGTHS, max_tokens=50)
    for r in rs:
        s.add_request(r)
    out = s.schedule()
    s.update_from_output(out, {x.request_id: 1 for x in out.scheduled if x.needs_sample})
    for r in rs:
        s.abort(r.request_id)
        assert r.status is RequestStatus.FINISHED_ABORTED
    assert not s.running and not s.waiting
    assert all(s.kv.num_free_blocks(g) == 200 for g in s.kv.groups)


def test_stop_token_and_min_tokens() -> None:
    s = make()
    r = Request("a", [1, 2, 3], SamplingParams(max_tokens=10, min_tokens=2, stop_token_ids=[5]), 0.0)
    s.add_request(r)
    for token in (5, 6, 5):  # the first 5 comes before min_tokens: not a stop
        out = s.schedule()
        s.update_from_output(out, {"a": token})
    assert r.status is RequestStatus.FINISHED_STOPPED and r.stop_reason == 5
    assert r.output_token_ids == [5, 6, 5]


@pytest.mark.parametrize("max_tokens", [1, 3])
def test_length_finish(max_tokens: int) -> None:
    s = make()
    assert drive(s, reqs([4], max_tokens)) == expected([4], max_tokens)


def test_admission_pacing_batches_newcomers_without_changing_outputs() -> None:
    import time

    kv = KVCacheManager(16, 200, GROUPS, enable_prefix_caching=False)
    s = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=4096,
                                  admission_delay_s=3600.0, admission_batch=3), kv)
    first, *late = reqs([5, 7, 9, 11], max_tokens=30)
    s.add_request(first)
    assert [x.request_id for x in s.schedule().scheduled] == ["r0"]  # nothing decoding: at once
    now = time.monotonic()
    for r in late:
        r.arrival_time = now
    s.add_request(late[0])
    s.add_request(late[1])
    out = s.schedule()
    assert [x.request_id for x in out.scheduled] == ["r0"]  # two newcomers < batch of 3: they wait
    s.add_request(late[2])
    assert [x.request_id for x in s.schedule().scheduled] == ["r0", "r1", "r2", "r3"]  # three: admitted
    # and the delay alone admits a lone newcomer once it has waited long enough
    s2 = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=4096,
                                   admission_delay_s=0.05, admission_batch=32),
                   KVCacheManager(16, 200, GROUPS, enable_prefix_caching=False))
    a, b = reqs([5, 7], max_tokens=30)
    s2.add_request(a)
    s2.schedule()
    b.arrival_time = time.monotonic()
    s2.add_request(b)
    assert [x.request_id for x in s2.schedule().scheduled] == ["r0"]
    time.sleep(0.06)
    assert [x.request_id for x in s2.schedule().scheduled] == ["r0", "r1"]


def test_admission_pacing_outputs_equal_unpaced() -> None:
    kv = KVCacheManager(16, 200, GROUPS, enable_prefix_caching=False)
    s = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=4096,
                                  admission_delay_s=0.001, admission_batch=3), kv)
    assert drive(s, reqs(LENGTHS)) == expected(LENGTHS)
