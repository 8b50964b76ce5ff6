"""A step left in flight (async scheduling, engine.py): launched, its sampled ids on their way to
the host, while the next step is scheduled and launched. Which requests may run ahead so, when
the next step may be launched beside the one in flight, and a step launched ahead of its own call
(while the grammars filled the masks of the step before it)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from osserve.engine.core.request import Request
from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.core.scheduler import Scheduler, SchedulerOutput
from osserve.engine.worker.runner import StepLogits
from osserve.engine.worker.sampler import SamplerOutput


@dataclass
class InFlightStep:
    """A launched step whose sampled ids have not been read on the host yet."""

    out: SchedulerOutput
    rows: dict[str, int]  # request id -> its row of token_ids
    requests: list[Request]  # in row order (an id may come back later: engine.py's `_collect` checks which)
    token_ids: torch.Tensor  # [S] on the device: the next step's decode inputs read it there
    host_ids: torch.Tensor  # [S] the same, copied without blocking (pinned on a GPU)
    copied: torch.cuda.Event | None  # marks the copy's end on a GPU
    profile: tuple[float, float, bool, bool]  # (schedule s, launch s, has a prefill, beside a step in flight)
    grammar_dead: set[str] = field(default_factory=set)  # requests whose grammar allowed no token here
    sampled: Mapping[str, int | list[int]] | None = None  # its ids on the host, once read (engine.py's `_collect`)


@dataclass
class LaunchedForward:
    """A step whose forward is launched and whose sampling is not (engine.py). Where the grammars
    fill masks, the step before it (`follows`) schedules it while they fill and launches its forward
    right after its own sampling, so that the GPU has it queued behind that sampling; its own call
    then goes on from the masks."""

    follows: InFlightStep | None
    out: SchedulerOutput
    rows: list[Request]  # the requests that sample, in row order
    prompt_tokens: int
    logits: StepLogits
    schedule_s: float
    launch_s: float


def start_host_copy(out: SchedulerOutput, rows: list[Request], result: SamplerOutput | None,
                    profile: tuple[float, float, bool, bool], on_host: torch.Tensor | None = None) -> InFlightStep:
    """Start copying the sampled ids to the host without waiting for them. on_host: the ids in
    pinned host memory, written by the step itself (no copy; the event marks the step's end)."""
    ids = result.token_ids if result is not None else torch.empty(0, dtype=torch.int64)
    copied = None
    if ids.is_cuda:
        if on_host is not None:
            host = on_host
        else:
            host = torch.empty(ids.shape, dtype=ids.dtype, pin_memory=True)
            host.copy_(ids, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
    else:
        host = ids
    return InFlightStep(out, {r.request_id: i for i, r in enumerate(rows)}, rows, ids, host, copied, profile)


def can_run_ahead(params: SamplingParams, num_output_tokens: int) -> bool:
    """The request's next token can be sampled before its last one reaches the host."""
    return (not params.penalized and params.logprobs is None
            and params.forced_token_ids is None and num_output_tokens >= params.min_tokens)


def runs_ahead(rows: list[Request], async_scheduling: bool) -> bool:
    """A step of these sampling requests can be left in flight: none needs its token on the host
    before the next step is launched."""
    return async_scheduling and all(can_run_ahead(r.sampling_params, r.num_output_tokens) for r in rows)


def ending_in_flight(scheduler: Scheduler) -> set[str]:
    """Requests whose token in flight is certain to be their last: they sit the next step out."""
    ends = scheduler.ends_by_length
    return {r.request_id for r in scheduler.running if r.num_pending > 0 and ends(r)}


def can_launch_beside(scheduler: Scheduler, ending: set[str]) -> bool:
    """The next step may be launched before the one in flight is read: every request it may hold
    can run ahead, and every running one gets its slots without a preemption (preemption is left to
    steps scheduled with every token known, as it always was for decodes). Prompt tokens (chunks,
    newcomers) join such a step with async prefill on; else only decodes and newcomers whose prompt
    is cached but for its last token do. `ending`: ending_in_flight's requests."""
    config, kv = scheduler.config, scheduler.kv
    free = config.max_num_seqs - len(scheduler.running)
    if scheduler.waiting and free > 0 and not _admissions_can_run_ahead(scheduler, free):
        return False  # an admission that needs the step in flight finished first
    going_on = [r for r in scheduler.running if r.request_id not in ending]
    if not all(can_run_ahead(r.sampling_params, r.num_output_tokens) for r in going_on):
        return False
    left = [r.num_tokens - r.num_computed_tokens for r in going_on]
    if all(n == 1 for n in left):
        return kv.can_allocate_all(going_on, 1)
    if not config.async_prefill:
        return False
    # A prompt chunk takes at most the step's prompt allowance (decode-first) or its budget.
    most = min(scheduler.prefill_allowance(ending), config.max_num_batched_tokens)
    return kv.can_allocate_all(going_on, [n if n == 1 else min(n, most) for n in left])


def _admissions_can_run_ahead(scheduler: Scheduler, free: int) -> bool:
    """Whether the next newcomers (up to `free`) may join a step launched beside the one in flight:
    they can run ahead, no token of theirs is in flight, and (async prefill off) they compute only
    their last token, their prompt cached but for it (kv_cache.py's last-block copies). Newcomers
    without a KV slot for them wait (the scheduler's admission never preempts). (Newcomers with a
    prefill beside the step in flight were measured on the short-prompt stress test on 2026-11-23
    and 2026-11-24: level or slower, BENCHMARKS.md, experiments not kept; on 1k-token prompts with
    decode-first's many prompt steps they won: async prefill, BENCHMARKS.md.)"""
    prefill_ok = scheduler.config.async_prefill
    for req in itertools.islice(scheduler.waiting, free):
        if req.num_pending or not can_run_ahead(req.sampling_params, req.num_output_tokens):
            return False
        if not prefill_ok and (req.num_computed_tokens or req.num_preemptions
                               or scheduler.kv.cached_prefix_tokens(req) != req.num_tokens - 1):
            return False
    return True


def schedule_following(scheduler: Scheduler) -> tuple[SchedulerOutput, float] | None:
    """The step after one in flight (advanced, its tokens pending), and the seconds its schedule took;
    None where that step must first be finished (can_launch_beside) or nothing is left to run. The
    engine calls it for the step before it (engine.py), or while that step's masks fill."""
    start = time.perf_counter()
    ending = ending_in_flight(scheduler)
    if not can_launch_beside(scheduler, ending):
        return None
    out = scheduler.schedule(ending)
    return (out, time.perf_counter() - start) if out.scheduled else None
