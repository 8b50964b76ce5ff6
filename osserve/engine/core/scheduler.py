"""Scheduler: continuous batching with one rule and no tensors.

Each step every scheduled request computes `min(num_tokens - num_computed_tokens, budget)` new
tokens: a whole prompt, a chunk of it (chunked prefill), or the one token a decode needs — all
in one batch. Running requests go first, in admission order; then waiting ones, first come first
served, while the token budget (max_num_batched_tokens), the cap on running requests
(max_num_seqs) and the KV pool allow. When a running request cannot get blocks, the most
recently admitted running request is preempted: its blocks are freed, it goes back to the front
of the queue with its output so far, and later recomputes prompt + output and goes on.

Decode-first (decode_first.py): the running requests that decode are counted before anything is
scheduled, and the step's prompt tokens (running prompt chunks, newcomers, recomputes) are held to
what the rule allows beside them; the decodes' own tokens are set aside in the budget, so a prompt
chunk ahead of them in the running order never takes their place.

Speculative decoding changes nothing of that rule: a request holding draft tokens (Request.drafts)
computes its last token and the drafts in one chunk; the step's update takes the tokens the
verification kept (one or more) and moves num_computed_tokens back past the rejected drafts, so
their KV is overwritten later and never reaches the prefix cache (only computed blocks are offered).
`lookahead` slots past each chunk are reserved for the draft model's guesses (speculative/eagle.py).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from osserve.config import SchedulerConfig
from osserve.engine.core.decode_first import prefill_allowance
from osserve.engine.core.kv_cache import BlockCopy, KVCacheManager
from osserve.engine.core.request import Request, RequestStatus, finished_status
from osserve.engine.core.sampling_params import SamplingParams
from osserve.errors import ContextLengthError, InvalidRequestError


@dataclass(slots=True)
class ScheduledRequest:
    """One request's share of a step: tokens [start, start + num_new_tokens)."""

    request_id: str
    start: int
    num_new_tokens: int
    block_tables: dict[str, list[int]]
    needs_sample: bool  # the chunk reaches the request's last token: sample the next one
    num_drafts: int = 0  # the chunk's last num_drafts tokens are draft tokens (Request.drafts), verified


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    block_copies: list[BlockCopy] = field(default_factory=list)  # KV to copy before the step (kv_cache.py)
    advanced: bool = False  # advance() counted the step's tokens as computed
    tokens_pending: bool = False  # ... and its sampled tokens as pending (async scheduling)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


@dataclass(slots=True)
class RequestUpdate:
    """What a step did to one request that sampled a token (or was finished)."""

    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None
    stop_reason: int | str | None


@dataclass
class SchedulerStats:
    num_running: int
    num_waiting: int
    num_preemptions: int


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager) -> None:
        self.config = config
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, Request] = {}
        self.num_preemptions = 0

    # ------------------------------------------------------------------ requests in and out
    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Reject, naming the field and the lengths, what could never be served."""
        n = len(prompt_token_ids)
        if n == 0:
            raise InvalidRequestError("the prompt is empty", "prompt")
        limit = self.config.max_model_len
        wanted = n + (params.max_tokens or 1)
        if n >= limit or (params.max_tokens is not None and wanted > limit):
            raise ContextLengthError(
                f"this model's maximum context length is {limit} tokens; the request has {n} prompt "
                f"tokens and asks for {params.max_tokens} more ({wanted} in all)",
                "max_tokens" if n < limit else "prompt",
            )
        if not self.kv.fits_at_all(wanted + self.config.speculative_slots, self.config.max_num_batched_tokens):
            raise ContextLengthError(
                f"a request of {wanted} tokens can never fit in the KV cache "
                f"({self.kv.num_blocks(self.kv.groups[-1])} blocks of {self.kv.block_size} tokens)",
                "max_tokens",
            )

    def add_request(self, req: Request) -> None:
        self.validate(req.prompt_token_ids, req.sampling_params)
        self.requests[req.request_id] = req
        self.waiting.append(req)

    def abort(self, request_id: str) -> None:
        self.finish(request_id, "abort")

    def finish(self, request_id: str, reason: str) -> None:
        """End a request (abort, a stop string, an error) and free every block it holds now."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return
        req.status = finished_status(reason)
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.kv.free(request_id)

    def num_waiting(self) -> int:
        return len(self.waiting)

    def stats(self) -> SchedulerStats:
        return SchedulerStats(len(self.running), len(self.waiting), self.num_preemptions)

    # ------------------------------------------------------------------ the step
    def schedule(self, skip: Collection[str] = (), lookahead: int = 0) -> SchedulerOutput:
        """The next step. `skip`: running requests to leave out of it (async scheduling: those
        whose in-flight token is certain to be their last). `lookahead`: KV slots to reserve past
        each chunk (speculative decoding's draft model writes its guesses there)."""
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        prefill = self.prefill_allowance(skip)
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            if req.request_id in skip:
                i += 1
                continue
            left = req.num_tokens - req.num_computed_tokens
            drafts = 0 if req.drafts is None else self._fitting_drafts(req, budget)
            if left > 1:  # a prompt chunk (or a preempted request's recompute): the prefill allowance
                if prefill <= 0:
                    i += 1  # the decodes took what the rule leaves this step
                    continue
                n = min(left, budget, prefill)
                prefill -= n
            else:
                n = min(left, budget) + drafts
            # Offer its computed blocks to the prefix cache before allocate_slots releases the
            # sliding ones that left the window (with a step in flight, update_from_output comes
            # after this; every token before num_computed_tokens is known here).
            self.kv.cache_computed_blocks(req)
            while not self.kv.allocate_slots(req, n + lookahead):
                victim = self.running.pop()  # the most recently admitted
                self._preempt(victim)
                out.preempted.append(victim.request_id)
                if victim is req:
                    break
            else:
                out.scheduled.append(self._scheduled(req, n, drafts))
                budget -= n
                i += 1
                continue
            break  # `req` itself was preempted: nothing after it is running any more
        if out.preempted:
            return out  # no room for newcomers while running requests are being evicted
        if not self._admit_now():
            return out
        while self.waiting and min(budget, prefill) > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            if req.num_computed_tokens == 0:
                cached = self.kv.claim_cached_prefix(req)
                req.num_computed_tokens = cached
                if not req.admitted_once:
                    req.num_cached_tokens = cached
            n = min(req.num_tokens - req.num_computed_tokens, budget, prefill)
            if not self.kv.allocate_slots(req, n + lookahead):
                self.kv.free(req.request_id)  # give back the claimed prefix too
                req.num_computed_tokens = 0
                break
            self.waiting.popleft()
            req.status = RequestStatus.RUNNING
            req.admitted_once = True
            if req.first_scheduled_time is None:
                req.first_scheduled_time = time.monotonic()
            self.running.append(req)
            out.scheduled.append(self._scheduled(req, n))
            budget -= n
            prefill -= n
        out.block_copies = self.kv.take_copies()
        return out

    def prefill_allowance(self, skip: Collection[str] = ()) -> int:
        """The step's prompt tokens under the decode-first rule (decode_first.py): the decodes
        (running requests with one token to compute, drafts and all) are counted first."""
        cfg = self.config
        num_decodes = decode_tokens = 0
        for req in self.running:
            if req.num_tokens - req.num_computed_tokens == 1 and req.request_id not in skip:
                num_decodes += 1
                decode_tokens += 1 + (len(req.drafts) if req.drafts is not None else 0)
        return prefill_allowance(cfg.max_num_batched_tokens, decode_tokens, num_decodes, cfg.decode_first_chunk,
                                 cfg.decode_first_min_decodes)

    def _admit_now(self) -> bool:
        """Admission pacing (SchedulerConfig.admission_delay_s): newcomers join a batch of decodes
        once the oldest has waited the delay or enough of them wait; with nothing decoding, at once."""
        cfg = self.config
        if cfg.admission_delay_s <= 0 or not self.waiting or not self.running:
            return True
        free = cfg.max_num_seqs - len(self.running)
        oldest = self.waiting[0]
        return (oldest.num_preemptions > 0 or len(self.waiting) >= min(cfg.admission_batch, free)
                or time.monotonic() - oldest.arrival_time >= cfg.admission_delay_s)

    def _scheduled(self, req: Request, n: int, drafts: int = 0) -> ScheduledRequest:
        start = req.num_computed_tokens
        return ScheduledRequest(
            request_id=req.request_id, start=start, num_new_tokens=n,
            block_tables=self.kv.block_tables(req.request_id),
            needs_sample=start + n - drafts == req.num_tokens, num_drafts=drafts,
        )

    @staticmethod
    def _fitting_drafts(req: Request, budget: int) -> int:
        """How many of the request's drafts join its chunk: all of them when its last token alone
        is left to compute and they fit the step's budget, else none (they are dropped)."""
        assert req.drafts is not None
        if req.num_tokens - req.num_computed_tokens != 1 or 1 + len(req.drafts) > budget:
            req.drafts = None
            return 0
        return len(req.drafts)

    def _preempt(self, req: Request) -> None:
        req.drafts = None
        self.kv.free(req.request_id)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def advance(self, out: SchedulerOutput, tokens_pending: bool = False) -> None:
        """Count a launched step's tokens as computed (and, with tokens_pending, the tokens it
        samples as in flight), so that the next step can be scheduled before this one ends."""
        for s in out.scheduled:
            req = self.requests.get(s.request_id)
            if req is None or req.status is not RequestStatus.RUNNING:
                continue
            req.num_computed_tokens += s.num_new_tokens
            if tokens_pending and s.needs_sample:
                req.num_pending += 1
        out.advanced, out.tokens_pending = True, tokens_pending

    def update_from_output(self, out: SchedulerOutput, sampled: Mapping[str, int | list[int]],
                           ) -> list[RequestUpdate]:
        """Once a step's sampled tokens are on the host: cache full blocks, append the tokens,
        check stops (advancing the computed counts first if advance() was not called). A request
        that verified drafts gets a list: the drafts kept, then the target's own token."""
        if not out.advanced:
            self.advance(out)
        updates: list[RequestUpdate] = []
        now = time.monotonic()
        for s in out.scheduled:
            req = self.requests.get(s.request_id)
            if req is None:
                continue  # finished meanwhile (abort, a stop string)
            # A request preempted while its token was in flight keeps the token (async only).
            sampling = s.needs_sample and req.status in (RequestStatus.RUNNING, RequestStatus.PREEMPTED)
            if s.num_drafts:
                verified = sampled[s.request_id]
                assert isinstance(verified, list)
                self._take_verified(req, s, verified, updates, now)
                continue
            token: int | None = sampled[s.request_id] if sampling else None  # type: ignore[assignment]
            if token is not None:
                if out.tokens_pending:
                    req.num_pending -= 1
                req.output_token_ids.append(token)
            if req.status is RequestStatus.RUNNING:
                # After the append: with a later step in flight, its input is this token.
                self.kv.cache_computed_blocks(req)
            if token is None:
                continue
            req.first_token_time = req.first_token_time or now
            req.last_token_time = now
            reason = self._stop_reason(req, token)
            updates.append(RequestUpdate(s.request_id, [token], reason is not None, reason,
                                         req.stop_reason))
            if reason is not None:
                self.finish(s.request_id, reason)
        return updates

    def _take_verified(self, req: Request, s: ScheduledRequest, tokens: list[int], updates: list[RequestUpdate],
                       now: float) -> None:
        """A verified chunk's tokens, one by one up to a stop; the computed count then covers the
        root and the drafts kept, so the rejected drafts' KV is never taken for computed."""
        new: list[int] = []
        reason = None
        for token in tokens:
            req.output_token_ids.append(token)
            new.append(token)
            reason = self._stop_reason(req, token)
            if reason is not None:
                break
        req.drafts = None
        req.num_computed_tokens -= s.num_drafts - (len(new) - 1)
        if req.status is RequestStatus.RUNNING:
            self.kv.cache_computed_blocks(req)
        req.first_token_time = req.first_token_time or now
        req.last_token_time = now
        updates.append(RequestUpdate(s.request_id, new, reason is not None, reason, req.stop_reason))
        if reason is not None:
            self.finish(s.request_id, reason)

    def _stop_reason(self, req: Request, token: int) -> str | None:
        p = req.sampling_params
        n_out = req.num_output_tokens
        if not p.ignore_eos and n_out >= p.min_tokens and token in p.stop_token_ids:
            req.stop_reason = token
            return "stop"
        if p.max_tokens is not None and n_out >= p.max_tokens:
            return "length"
        if req.num_prompt_tokens + n_out >= self.config.max_model_len:
            return "length"
        return None

    def ends_by_length(self, req: Request) -> bool:
        """Its tokens in flight will bring the request to max_tokens or to the context limit."""
        p = req.sampling_params
        out = req.num_output_tokens + req.num_pending
        return (p.max_tokens is not None and out >= p.max_tokens) or req.num_tokens >= self.config.max_model_len
