"""What the engine tells its callers: per-step deltas, final outputs, stats, and the narrow
interface a server needs (`EngineClient`), so server tests can pass a stub that replays tokens."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from osserve.engine.core.sampling_params import SamplingParams


@dataclass
class TokenLogprob:
    """The chosen token's logprob and the top alternatives (id, logprob), best first."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass(slots=True)
class CompletionDelta:
    """One request's news from one engine step (streamed by AsyncEngine.generate)."""

    request_id: str
    new_token_ids: list[int]
    new_text: str  # the decoded text of the new tokens (stop strings already cut out)
    new_logprobs: list[TokenLogprob] | None
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | "error" | "grammar" (error says why)
    stop_reason: int | str | None  # the stop token id or stop string that ended it
    num_prompt_tokens: int
    num_cached_tokens: int  # prompt tokens served from the prefix cache
    num_output_tokens: int  # so far
    error: str | None = None
    queue_time: float | None = None  # seconds from arrival to first scheduling (on the last delta)

    def then(self, later: CompletionDelta) -> CompletionDelta:
        """This delta followed by a later one of the same request, as one delta. A consumer that
        fell behind takes every waiting delta at once (coalesce), so a busy server writes one
        chunk per request per turn instead of one per token."""
        logprobs = None if self.new_logprobs is None and later.new_logprobs is None else \
            (self.new_logprobs or []) + (later.new_logprobs or [])
        return CompletionDelta(
            request_id=self.request_id, new_token_ids=self.new_token_ids + later.new_token_ids,
            new_text=self.new_text + later.new_text, new_logprobs=logprobs, finished=later.finished,
            finish_reason=later.finish_reason, stop_reason=later.stop_reason,
            num_prompt_tokens=later.num_prompt_tokens, num_cached_tokens=later.num_cached_tokens,
            num_output_tokens=later.num_output_tokens, error=later.error,
            queue_time=later.queue_time if later.queue_time is not None else self.queue_time,
        )


def error_delta(request_id: str, message: str) -> CompletionDelta:
    """The last delta of a request the engine could not finish (the step loop died)."""
    return CompletionDelta(
        request_id=request_id, new_token_ids=[], new_text="", new_logprobs=None, finished=True,
        finish_reason="error", stop_reason=None, num_prompt_tokens=0, num_cached_tokens=0,
        num_output_tokens=0, error=message,
    )


def coalesce(first: CompletionDelta, queue: asyncio.Queue[Any]) -> CompletionDelta:
    """`first` joined with every delta already waiting in `queue` (none of them awaited), up to
    the request's last. (An engine's rejection comes alone, before any delta.)"""
    out = first
    while not out.finished and not queue.empty():
        out = out.then(queue.get_nowait())
    return out


class RequestNews(Protocol):
    """What the engine hands a request's queue: a delta, or (engine/process_engine.py) a rejection."""

    request_id: str

    @property
    def finished(self) -> bool: ...


Queues = dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[Any]]]  # request id -> its loop and queue


def deliver(queues: Queues, items: list[Any]) -> None:
    """From the engine's thread: hand each item (a RequestNews) to its request's queue, waking
    each event loop once for the lot. Each call_soon_threadsafe writes to the loop's wake-up
    pipe: once per request was 229 writes per step at 256 streams. A finished item is its
    request's last, and the request leaves `queues`."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[Any], Any]]] = {}
    for item in items:
        target = queues.get(item.request_id)
        if target is None:
            continue
        loop, queue = target
        if item.finished:
            queues.pop(item.request_id, None)
        by_loop.setdefault(loop, []).append((queue, item))
    for loop, pairs in by_loop.items():
        loop.call_soon_threadsafe(_put_all, pairs)


def _put_all(pairs: list[tuple[asyncio.Queue[Any], Any]]) -> None:
    for queue, item in pairs:
        queue.put_nowait(item)


@dataclass
class RequestOutput:
    """A finished request (LLM.generate's result): ids and text of the whole output."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    stop_reason: int | str | None
    logprobs: list[TokenLogprob] | None
    num_cached_tokens: int


@dataclass
class EngineStats:
    """A snapshot for /metrics and logs."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0  # fraction of the full-attention pool in use
    num_free_blocks: int = 0
    num_total_blocks: int = 0
    prefix_cache_hits: int = 0  # tokens
    prefix_cache_queries: int = 0  # tokens
    num_preemptions: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    # Speculative decoding (vLLM's meanings): drafts verified, draft tokens verified, draft tokens
    # accepted, and those by position in the draft (index 0: the first draft token). None: no speculation.
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_position: list[int] | None = None


class EngineClient(Protocol):
    """The narrow interface the HTTP server uses (AsyncEngine implements it)."""

    @property
    def max_model_len(self) -> int: ...

    @property
    def is_ready(self) -> bool: ...

    @property
    def tokenizer(self) -> Any: ...

    def shutdown(self) -> None: ...

    def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, request_id: str
    ) -> AsyncIterator[CompletionDelta]:
        """Validate (raising osserve.errors before anything is queued), enqueue, then yield
        deltas until one has finished=True. Closing the iterator early aborts the request."""
        ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats: ...
