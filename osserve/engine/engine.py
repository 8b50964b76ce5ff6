"""LLMEngine: the step loop — schedule → run → sample → update → report.

    out = scheduler.schedule()                      # plain Python: who computes which tokens
    logits = runner.run(entries(out))               # tensors: one forward over the flat batch
    tokens = sampler(logits, sampling_batch(out))   # on device, one host copy
    updates = scheduler.update_from_output(out, tokens)
    return outputs.process(updates)                 # text, stop strings, logprobs → deltas

With async scheduling (SchedulerConfig.async_scheduling) a step whose requests need nothing of
their tokens on the host before sampling the next (no penalties, logprobs, forced tokens or
pending min_tokens) is left in flight: the next call schedules and launches step N+1, its decode
inputs read from step N's sampled ids on the device, and only then waits for step N's tokens and
turns them into deltas — so the host's scheduling, batch building and detokenising overlap the
GPU's work instead of alternating with it. A request whose in-flight token is certain to end it
(max_tokens, the context limit) sits the next step out; one that stops on a stop token or string
costs one wasted row. Prompt chunks and newcomers join such a step too (async prefill; off,
only newcomers whose prompt is cached but for its last token do). Anything else (a request that
needs its tokens, too few free blocks to give every running request its slots without a
preemption) first finishes the step in flight.

A request with an output constraint (structured/) joins the scheduler once its grammar is
compiled (in a worker thread). Its matcher sees every token it samples, and each step its token
mask is filled on the host while the GPU runs the step's forward, then applied before sampling.
Such a request runs ahead like any other: where the step before it is still in flight, the new
step's forward is launched first, then that step's tokens are read and fed to the matchers, then
the masks are filled: the GPU is never idle for the grammar, the host waits once per step. While
llguidance fills the masks in its own threads (or the grammar processes do), the step before's
tokens become deltas and the next step is scheduled; the next step's forward is launched right
after this step's sampling, so the GPU finds it queued. (When the next call launched it, the GPU
sat idle after each sampling while the host built the batch. JSON-schema serving against plain,
one H100: 3.4-12.3% lower before, a median of 2.2% lower after; BENCHMARKS.md.)

With speculative decoding (speculative/decoder.py) a step in which some request holds or wants
drafts is a speculative step instead (engine/speculative_step.py: verify the drafts, keep one or
more tokens a request, draft the next ones). Such steps are synchronous: the step in flight is
finished first, as the accepted counts decide the next step.

AsyncEngine (engine/async_engine.py) runs this loop in a thread for the server; LLM
(engine/llm.py) drives it directly for offline use.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from osserve.config import CacheConfig, ModelConfig, SchedulerConfig
from osserve.engine.core.kv_cache import KVCacheManager, KVCacheStats
from osserve.engine.core.output_processor import OutputProcessor
from osserve.engine.core.outputs import CompletionDelta, EngineStats, TokenLogprob
from osserve.engine.core.request import Request
from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.core.scheduler import Scheduler, SchedulerOutput
from osserve.engine.in_flight import (
    InFlightStep,
    LaunchedForward,
    runs_ahead,
    schedule_following,
    start_host_copy,
)
from osserve.engine.speculative_step import speculates_next, speculative_step
from osserve.engine.step_batch import step_batch
from osserve.engine.step_profile import StepProfile
from osserve.engine.worker.runner import ModelRunner
from osserve.engine.worker.sampler import MaskUpload, RowSettings, Sampler, SamplerOutput, SamplingBatch
from osserve.errors import InvalidRequestError
from osserve.speculative.decoder import SpeculativeDecoder
from osserve.structured.grammar_process import RemoteGrammars, in_own_process
from osserve.structured.matchers import Grammars, MaskBits
from osserve.tokenizer import Tokenizer


@dataclass
class EngineParts:
    """What an engine is assembled from (engine/load.py builds them from CLI flags)."""

    model_config: ModelConfig
    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    runner: ModelRunner
    kv: KVCacheManager
    tokenizer: Tokenizer
    speculative: SpeculativeDecoder | None = None


class LLMEngine:
    def __init__(self, parts: EngineParts) -> None:
        self.model_config = parts.model_config
        self.scheduler_config = parts.scheduler_config
        self.runner = parts.runner
        self.kv = parts.kv
        self.tokenizer = parts.tokenizer
        self.scheduler = Scheduler(parts.scheduler_config, parts.kv)
        self.sampler = Sampler()
        self.outputs = OutputProcessor(parts.tokenizer)
        self.requests: dict[str, Request] = {}
        self.generators: dict[str, torch.Generator] = {}
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.profile = StepProfile()
        self.step_ended: float | None = None  # when the last step() returned, while requests were left
        self.in_flight: InFlightStep | None = None
        self.launched: LaunchedForward | None = None  # the next step's forward, launched by this one
        cuda = self.runner.device.type == "cuda"
        self.grammars: Grammars | RemoteGrammars = (
            RemoteGrammars(parts.model_config.vocab_size, parts.scheduler_config.max_num_seqs, pin_memory=cuda)
            if in_own_process(cuda) else Grammars(parts.model_config.vocab_size, pin_memory=cuda))
        self.mask_upload = MaskUpload(self.runner.device)
        self.row_settings: RowSettings | None = None  # the last step's rows' (reused while they sample in order)
        self.compiling: dict[str, Request] = {}  # waiting for their grammar before they are scheduled
        self.spec = parts.speculative
        self.speculating = False  # the last step was a speculative one (its drafts may wait)

    @property
    def max_model_len(self) -> int:
        return self.scheduler_config.max_model_len

    # ------------------------------------------------------------------ requests in and out
    def validate_request(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> None:
        """Raise a typed osserve.errors error naming the field for any bad input. Reads only
        configuration, so any thread may call it."""
        params.validate(self.model_config.vocab_size)
        if request_id in self.requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use", "request_id")
        vocab = self.model_config.vocab_size
        bad = [t for t in prompt_token_ids if not (isinstance(t, int) and 0 <= t < vocab)]
        if bad:
            raise InvalidRequestError(
                f"prompt holds token ids outside the vocabulary [0, {vocab}): {bad[:5]}", "prompt"
            )
        self.scheduler.validate(prompt_token_ids, params)

    def add_request(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> None:
        """Validate and queue; raises a typed osserve.errors error before anything is queued."""
        self.validate_request(request_id, prompt_token_ids, params)
        if params.max_tokens is None:
            params.max_tokens = max(1, self.max_model_len - len(prompt_token_ids))
        req = Request(request_id=request_id, prompt_token_ids=list(prompt_token_ids),
                      sampling_params=params, arrival_time=time.monotonic())
        grammar = self.grammars.grammar_for(params.structured, params.max_tokens) if params.structured else None
        if grammar is None:
            self.scheduler.add_request(req)  # raises on empty / too long / larger than the pool
        else:  # checked already (structured.grammar.check: the server, LLM); compiled off the loop
            self.grammars.start(request_id, grammar.text, grammar.free, grammar.bounded)
            self.compiling[request_id] = req
        self.requests[request_id] = req
        self.outputs.add(req)
        if params.seed is not None:
            self.generators[request_id] = torch.Generator(self.runner.device).manual_seed(params.seed)

    def abort(self, request_id: str) -> CompletionDelta | None:
        """End a request now, freeing its blocks; returns its final delta if it was live."""
        req = self.requests.get(request_id)
        if req is None:
            return None
        self.compiling.pop(request_id, None)
        self.scheduler.abort(request_id)
        return self._retire(self.outputs.finish(req, "abort"))

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def reset_stats(self) -> None:
        """Forget the counts so far (warm_up.py's requests are not the server's)."""
        self.prompt_tokens_total = self.generation_tokens_total = 0
        self.profile = StepProfile()
        self.kv.stats = KVCacheStats()
        if self.spec is not None:
            self.spec.reset_stats()

    # ------------------------------------------------------------------ the step
    def step(self) -> list[CompletionDelta]:
        start = time.perf_counter()
        if self.step_ended is not None:
            self.profile.between += start - self.step_ended
        compiled = self._admit_compiled() if self.compiling else []
        admitted = time.perf_counter()
        self.profile.admit += admitted - start
        deltas = compiled + self._step()
        if self.in_flight is not None and not self.requests:
            # Every request of the step in flight has ended (its rows were wasted on stop tokens):
            # nothing will read it, and a later request must not meet its tokens.
            self._collect(self.in_flight)
            self.in_flight = None
        end = time.perf_counter()
        self.profile.in_step += end - start
        # The caller's time until the next step counts only while requests are left (an idle
        # server waits for new ones).
        self.step_ended = end if self.requests else None
        return deltas

    def _admit_compiled(self) -> list[CompletionDelta]:
        """Requests whose grammar is ready join the scheduler (waiting for them when nothing else
        can run); those whose grammar failed to build end with finish reason "grammar"."""
        idle = self.in_flight is None and not self.scheduler.running and not self.scheduler.waiting
        deltas = []
        for rid, error in self.grammars.ready(wait=idle):
            req = self.compiling.pop(rid, None)
            if req is None:
                continue
            if error is None:
                self.scheduler.add_request(req)
            else:
                deltas.append(self._retire(self.outputs.finish(req, "grammar", error)))
        return deltas

    def _step(self) -> list[CompletionDelta]:
        if self.spec is not None and speculates_next(self, self.spec):
            flight = self.in_flight
            if flight is None:
                return self._spec_step()
            self.in_flight = None
            return self._finish(flight)  # drain: a speculative step needs every token known
        prev = self.in_flight
        launched, self.launched = self.launched, None
        if launched is not None and launched.follows is not prev:
            launched = None  # its requests all ended with the step before (step()): nothing reads it
        if launched is None:
            if prev is not None:
                following = schedule_following(self.scheduler)
                if following is None:  # drain (the next call schedules with every token known), or nothing to run
                    self.in_flight = None
                    return self._finish(prev)
                out, schedule_s = following
            else:
                t0 = time.perf_counter()
                out = self.scheduler.schedule()
                if not out.scheduled:
                    return []
                schedule_s = time.perf_counter() - t0
            launched = self._launch(out, prev, schedule_s)
        else:
            self.profile.launched_early += 1
        return self._sample(launched, prev)

    def _launch(self, out: SchedulerOutput, prev: InFlightStep | None, schedule_s: float) -> LaunchedForward:
        """Build a scheduled step's batch and launch its forward."""
        start, inside = time.perf_counter(), self._inside_totals()
        entries, rows, prompt_tokens = step_batch(out, self.requests, prev)
        step_logits = self.runner.run(entries, prev.token_ids if prev is not None else None, out.block_copies)
        launch_s = time.perf_counter() - start - (self._inside_totals() - inside)
        return LaunchedForward(prev, out, rows, prompt_tokens, step_logits, schedule_s, launch_s)

    def _sample(self, launched: LaunchedForward, prev: InFlightStep | None) -> list[CompletionDelta]:
        """Sample a launched step (its grammars' masks first), leave it in flight where it may run
        ahead, and turn the step before's tokens into deltas."""
        t1, inside = time.perf_counter(), self._inside_totals()
        out, rows, step_logits = launched.out, launched.rows, launched.logits
        masks = None
        deltas: list[CompletionDelta] | None = None  # the step before's, once turned into deltas
        outputs_time = 0.0
        following: tuple[SchedulerOutput, float] | None = None  # the next step, scheduled early
        if self.grammars.states:
            # The masks need the step before's tokens in the matchers: read them now, the GPU busy
            # with this step's forward. (Also the buffer's reuse rule: the masks of the step before
            # have reached the device once its tokens are on the host.)
            if prev is not None:
                self._collect(prev)
            start = time.perf_counter()
            fill = self.grammars.begin_masks([r.request_id for r in rows])
            self.profile.grammar += time.perf_counter() - start
            if fill is not None:
                if prev is not None and fill.in_background:
                    # The step before's outputs while llguidance fills the masks in its own threads.
                    start, before = time.perf_counter(), self._inside_totals()
                    deltas = self._finish(prev)
                    if self.spec is None and runs_ahead(rows, self.scheduler_config.async_scheduling):
                        # And the next step's schedule, which needs no token of this one: the masks
                        # are often not ready after the outputs, and its forward is launched right
                        # after this step's sampling (BENCHMARKS.md, structured outputs).
                        self.scheduler.advance(out, tokens_pending=True)
                        following = schedule_following(self.scheduler)
                    outputs_time = time.perf_counter() - start - (self._inside_totals() - before)
                start = time.perf_counter()
                masks = self.grammars.end_masks(fill)
                self.profile.grammar += time.perf_counter() - start
                self.profile.mask_wait += masks.waited
                if masks.process_times is not None:
                    self.profile.process_start += masks.process_times[0]
                    self.profile.process_work += masks.process_times[1]
        result = self._launch_sample(rows, step_logits.logits, step_logits.greedy,
                                     (masks.rows, masks.bits) if masks is not None and masks.rows else None)
        # The ids are on the host already where the sampler took the head's greedy ids as they are.
        on_host = step_logits.greedy_host if result is not None and result.token_ids is step_logits.greedy else None
        # Advanced early (above): it runs ahead.
        ahead = out.advanced or runs_ahead(rows, self.scheduler_config.async_scheduling)
        if not out.advanced:
            self.scheduler.advance(out, tokens_pending=ahead)
        self.prompt_tokens_total += launched.prompt_tokens
        t2 = time.perf_counter()
        has_prefill = any(s.num_new_tokens > 1 for s in out.scheduled)
        launch = launched.launch_s + t2 - t1 - (self._inside_totals() - inside) - outputs_time
        step = start_host_copy(out, rows, result, (launched.schedule_s, launch, has_prefill, prev is not None), on_host)
        if following is not None:
            # Requests that end below (a token the grammar rejected) waste their row in it, as a
            # stop does in any step launched before the token that stops it is known.
            self.launched = self._launch(following[0], step, following[1])
        if masks is not None:
            step.grammar_dead = {rows[i].request_id for i in masks.dead}
        if deltas is None:
            deltas = self._finish(prev) if prev is not None else []
        if masks is not None:  # tokens of the step before that a grammar rejected, known only now
            deltas += [self._end_by_grammar(rid) for rid in masks.rejected if rid in self.requests]
        if ahead:
            self.in_flight = step
            return deltas
        self.in_flight = None
        return deltas + self._finish(step, result)

    def _spec_step(self) -> list[CompletionDelta]:
        """One speculative step (engine/speculative_step.py): a method for bench_spec.py to time."""
        assert self.spec is not None
        return speculative_step(self, self.spec)

    def _launch_sample(self, rows: list[Request], logits: torch.Tensor, greedy: torch.Tensor | None,
                       token_masks: tuple[list[int], MaskBits] | None = None) -> SamplerOutput | None:
        if not rows:
            return None
        batch = SamplingBatch.build(
            params=[r.sampling_params for r in rows],
            prompt_ids=[r.prompt_token_ids for r in rows],
            output_ids=[r.output_token_ids for r in rows],
            generators=[self.generators.get(r.request_id) for r in rows],
            device=logits.device,
            token_masks=self.mask_upload.upload(*token_masks) if token_masks is not None else None,
            settings=self.row_settings,
        )
        self.row_settings = batch.settings
        result = self.sampler.sample(logits, batch, greedy)
        if token_masks is not None:
            self.mask_upload.sampled()
        return result

    def _finish(self, step: InFlightStep, result: SamplerOutput | None = None) -> list[CompletionDelta]:
        """Wait for a step's tokens on the host; update the requests; turn tokens into deltas.
        `result` (the sampler's output) is given when the step was not left in flight, for logprobs."""
        t2 = time.perf_counter()
        inside = self._inside_totals()
        sampled = self._collect(step)
        deltas = [self._end_by_grammar(rid) for rid in step.grammar_dead if rid in self.requests]
        logprobs: dict[str, TokenLogprob | None] = {}
        if result is not None and result.logprobs is not None:
            reqs = sorted(step.rows, key=step.rows.__getitem__)
            wanted = [self.requests[rid].sampling_params.logprobs if rid in self.requests else None for rid in reqs]
            logprobs = dict(zip(reqs, result.token_logprobs(wanted), strict=True))
        updates = self.scheduler.update_from_output(step.out, sampled)
        for upd in updates:
            req = self.requests.get(upd.request_id)
            if req is None:
                continue
            delta = self.outputs.process(req, upd, logprobs.get(upd.request_id))
            if delta is None:
                continue
            self.generation_tokens_total += len(delta.new_token_ids)
            if delta.finished and not req.status.is_finished:
                self.scheduler.finish(req.request_id, delta.finish_reason or "stop")  # a stop string
            deltas.append(self._retire(delta) if delta.finished else delta)
        schedule, launch, has_prefill, beside = step.profile
        post = time.perf_counter() - t2 - (self._inside_totals() - inside)
        self.profile.add(len(step.out.scheduled), schedule, launch, post, has_prefill=has_prefill,
                         in_flight=step.out.tokens_pending, beside=beside)
        return deltas

    def _inside_totals(self) -> float:
        """The profile's waits for sampled ids and grammar time so far: what a window of the loop
        takes out of its own time (they happen inside the launch or the outputs)."""
        return self.profile.gpu_wait + self.profile.grammar

    def _collect(self, step: InFlightStep) -> Mapping[str, int | list[int]]:
        """A step's sampled ids on the host (waiting for them once), fed to the grammars once.
        A token a grammar rejects (none should pass its mask) ends that request at this step.
        (A speculative step comes with its tokens, a list for each request that verified drafts.)"""
        if step.sampled is None:
            if step.copied is not None:
                start = time.perf_counter()
                step.copied.synchronize()
                self.profile.gpu_wait += time.perf_counter() - start
            token_ids = step.host_ids.tolist()
            sampled = {rid: token_ids[i] for rid, i in step.rows.items()}
            step.sampled = sampled
            if self.grammars.states:  # only to the requests of this step (not a newcomer with a reused id)
                start = time.perf_counter()
                live = {r.request_id: sampled[r.request_id] for r in step.requests
                        if self.requests.get(r.request_id) is r}
                step.grammar_dead |= self.grammars.accept(live, defer=True)
                spent = time.perf_counter() - start
                self.profile.grammar += spent
                self.profile.grammar_accept += spent
        return step.sampled

    def _end_by_grammar(self, request_id: str) -> CompletionDelta:
        """End a request whose grammar allows nothing more (its token of this step is not kept)."""
        req = self.requests[request_id]
        self.scheduler.finish(request_id, "grammar")
        return self._retire(self.outputs.finish(req, "grammar", self.grammars.failure(request_id)))

    def _retire(self, delta: CompletionDelta) -> CompletionDelta:
        self.requests.pop(delta.request_id, None)
        self.generators.pop(delta.request_id, None)
        self.outputs.remove(delta.request_id)
        self.grammars.drop(delta.request_id)
        if self.spec is not None:
            self.spec.drop(delta.request_id)
        return delta

    def stats(self) -> EngineStats:
        s = self.scheduler.stats()
        spec = self.spec.stats if self.spec is not None else None
        return EngineStats(
            num_running=s.num_running,
            num_waiting=s.num_waiting,
            kv_cache_usage=self.kv.usage(),
            num_free_blocks=self.kv.num_free_blocks("full") if "full" in self.kv.groups else 0,
            num_total_blocks=self.kv.num_blocks("full") if "full" in self.kv.groups else 0,
            prefix_cache_hits=self.kv.stats.prefix_cache_hits,
            prefix_cache_queries=self.kv.stats.prefix_cache_queries,
            num_preemptions=s.num_preemptions,
            prompt_tokens_total=self.prompt_tokens_total,
            generation_tokens_total=self.generation_tokens_total,
            spec_num_drafts=spec.num_drafts if spec is not None else 0,
            spec_num_draft_tokens=spec.num_draft_tokens if spec is not None else 0,
            spec_num_accepted_tokens=spec.num_accepted_tokens if spec is not None else 0,
            spec_accepted_per_position=list(spec.accepted_per_position) if spec is not None else None,
        )
