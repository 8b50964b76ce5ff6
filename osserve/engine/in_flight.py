"""A step left in flight (async scheduling, engine.py): launched, its sampled ids on their way to
the host, while the next step is scheduled and launched. Which requests may run ahead so."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from osserve.engine.core.request import Request
from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.core.scheduler import SchedulerOutput
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
    return (params.repetition_penalty == 1.0 and params.frequency_penalty == 0.0
            and params.presence_penalty == 0.0 and params.logprobs is None
            and params.forced_token_ids is None and num_output_tokens >= params.min_tokens)
