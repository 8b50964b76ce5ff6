"""LLMEngine: the synchronous step loop — schedule → run → sample → update → report.

    out = scheduler.schedule()                      # plain Python: who computes which tokens
    logits = runner.run(entries(out))               # tensors: one forward over the flat batch
    tokens = sampler(logits, sampling_batch(out))   # on device, one host copy
    updates = scheduler.update_from_output(out, tokens)
    return outputs.process(updates)                 # text, stop strings, logprobs → deltas

AsyncEngine (engine/async_engine.py) runs this loop in a thread for the server; LLM
(engine/llm.py) drives it directly for offline use.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from osserve.config import CacheConfig, ModelConfig, SchedulerConfig
from osserve.engine.kv_cache import KVCacheManager
from osserve.engine.output_processor import OutputProcessor
from osserve.engine.outputs import CompletionDelta, EngineStats, TokenLogprob
from osserve.engine.request import Request
from osserve.engine.runner import BatchEntry, ModelRunner
from osserve.engine.sampler import Sampler, SamplingBatch
from osserve.engine.sampling_params import SamplingParams
from osserve.engine.scheduler import Scheduler, SchedulerOutput
from osserve.errors import InvalidRequestError
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


@dataclass
class StepProfile:
    """Where the step loop's wall time goes (host clock). `launch` is building the batch and
    queueing the forward; `gpu_wait` is the sampler waiting for the GPU; `post` is stop checks,
    detokenisation and deltas. Logged by the server every `every` steps."""

    steps: int = 0
    requests: int = 0
    schedule: float = 0.0
    launch: float = 0.0
    gpu_wait: float = 0.0
    post: float = 0.0
    steps_with_prefill: int = 0  # these run eagerly; decode-only steps replay a CUDA graph (GPU)
    every: int = 500

    def add(self, batch: int, schedule: float, launch: float, gpu_wait: float, post: float,
            has_prefill: bool = False) -> None:
        self.steps += 1
        self.steps_with_prefill += has_prefill
        self.requests += batch
        self.schedule += schedule
        self.launch += launch
        self.gpu_wait += gpu_wait
        self.post += post

    def summary(self) -> str:
        n = max(self.steps, 1)
        return (f"{self.steps} steps ({self.steps_with_prefill} with prefill), mean batch {self.requests / n:.1f}; "
                f"ms per step: schedule "
                f"{1000 * self.schedule / n:.2f}, build+launch {1000 * self.launch / n:.2f}, wait for GPU "
                f"{1000 * self.gpu_wait / n:.2f}, outputs {1000 * self.post / n:.2f}")


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
        self.scheduler.add_request(req)  # raises on empty / too long / larger than the pool
        self.requests[request_id] = req
        self.outputs.add(req)
        if params.seed is not None:
            self.generators[request_id] = torch.Generator(self.runner.device).manual_seed(params.seed)

    def abort(self, request_id: str) -> CompletionDelta | None:
        """End a request now, freeing its blocks; returns its final delta if it was live."""
        req = self.requests.get(request_id)
        if req is None:
            return None
        self.scheduler.abort(request_id)
        return self._retire(self.outputs.finish(req, "abort"))

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    # ------------------------------------------------------------------ the step
    def step(self) -> list[CompletionDelta]:
        t0 = time.perf_counter()
        out = self.scheduler.schedule()
        if not out.scheduled:
            return []
        t1 = time.perf_counter()
        entries = [
            BatchEntry(
                token_ids=self.requests[s.request_id].token_slice(s.start, s.start + s.num_new_tokens),
                start_pos=s.start,
                block_tables=s.block_tables,
                sample=s.needs_sample,
            )
            for s in out.scheduled
        ]
        logits = self.runner.run(entries)  # launches; the GPU runs on while the host goes on
        t2 = time.perf_counter()
        sampled = self._sample(out, logits)  # waits for the GPU (the sampled ids come to the host)
        t3 = time.perf_counter()
        self.prompt_tokens_total += sum(
            min(s.num_new_tokens, max(0, self.requests[s.request_id].num_prompt_tokens - s.start))
            for s in out.scheduled
        )
        updates = self.scheduler.update_from_output(out, {rid: t for rid, (t, _) in sampled.items()})
        deltas = []
        for upd in updates:
            req = self.requests[upd.request_id]
            lp = sampled.get(upd.request_id, (0, None))[1]
            delta = self.outputs.process(req, upd, lp)
            if delta is None:
                continue
            self.generation_tokens_total += len(delta.new_token_ids)
            if delta.finished and not req.status.is_finished:
                self.scheduler.finish(req.request_id, delta.finish_reason or "stop")  # a stop string
            deltas.append(self._retire(delta) if delta.finished else delta)
        self.profile.add(len(out.scheduled), t1 - t0, t2 - t1, t3 - t2, time.perf_counter() - t3,
                         has_prefill=any(s.num_new_tokens > 1 for s in out.scheduled))
        return deltas

    def _sample(self, out: SchedulerOutput, logits: torch.Tensor) -> dict[str, tuple[int, TokenLogprob | None]]:
        rows = [self.requests[s.request_id] for s in out.scheduled if s.needs_sample]
        if not rows:
            return {}
        batch = SamplingBatch.build(
            params=[r.sampling_params for r in rows],
            prompt_ids=[r.prompt_token_ids for r in rows],
            output_ids=[r.output_token_ids for r in rows],
            generators=[self.generators.get(r.request_id) for r in rows],
            device=logits.device,
        )
        result = self.sampler.sample(logits, batch)
        token_ids = result.token_ids.tolist()
        logprobs = self.outputs.logprobs_rows(result, [r.sampling_params.logprobs for r in rows])
        return {r.request_id: (t, lp) for r, t, lp in zip(rows, token_ids, logprobs, strict=True)}

    def _retire(self, delta: CompletionDelta) -> CompletionDelta:
        self.requests.pop(delta.request_id, None)
        self.generators.pop(delta.request_id, None)
        self.outputs.remove(delta.request_id)
        return delta

    def stats(self) -> EngineStats:
        s = self.scheduler.stats()
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
        )
