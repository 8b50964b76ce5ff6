"""Request: one generation's state, plain Python (the scheduler and KV manager read it)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from osserve.engine.core.sampling_params import SamplingParams

if TYPE_CHECKING:
    from osserve.speculative.tree import DraftTree


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # waiting again after its blocks were taken; resumes by recompute
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"
    FINISHED_GRAMMAR = "grammar"  # its output grammar allowed no next token (structured outputs)

    @property
    def is_finished(self) -> bool:
        return self.value in FINISH_REASONS


FINISH_REASONS = ("stop", "length", "abort", "error", "grammar")
PENDING_TOKEN = -1  # stands for a token sampled on the device that the host has not read yet


def finished_status(reason: str) -> RequestStatus:
    return RequestStatus(reason)


@dataclass(slots=True)
class Request:
    """One request. The one scheduling rule (vLLM v1): each step, `num_computed_tokens` catches
    up with `num_tokens` (prompt + output so far), as far as the step's budget allows."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at first admission
    num_preemptions: int = 0
    stop_reason: int | str | None = None
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    admitted_once: bool = False
    # Tokens sampled by a step still in flight (async scheduling): counted in num_tokens, so the
    # next step can be scheduled before they are known; token_slice shows them as PENDING_TOKEN.
    num_pending: int = 0
    # Speculative decoding: draft tokens after the last token, verified with it next step. Not
    # counted in num_tokens: the scheduler adds them to the request's chunk (vLLM v1's rule).
    drafts: DraftTree | None = None

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_slice(self, start: int, end: int) -> list[int]:
        """all_token_ids[start:end] without building the whole list (decode steps are hot)."""
        p = len(self.prompt_token_ids)
        known = p + len(self.output_token_ids)
        pending = [PENDING_TOKEN] * (min(end, known + self.num_pending) - max(start, known))
        if start >= p:
            return self.output_token_ids[start - p: end - p] + pending
        return self.prompt_token_ids[start:end] + self.output_token_ids[: max(0, end - p)] + pending

    def token_at(self, pos: int) -> int:
        """all_token_ids[pos] (PENDING_TOKEN for a token in flight): a decode step's one input."""
        p = len(self.prompt_token_ids)
        if pos < p:
            return self.prompt_token_ids[pos]
        out = pos - p
        return self.output_token_ids[out] if out < len(self.output_token_ids) else PENDING_TOKEN

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids) + self.num_pending

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def finish_reason(self) -> str | None:
        return self.status.value if self.status.is_finished else None

    @property
    def queue_time(self) -> float | None:
        return None if self.first_scheduled_time is None else self.first_scheduled_time - self.arrival_time

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time
