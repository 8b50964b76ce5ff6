"""A test EngineClient that replays scripted token sequences, one token per delta, honouring
max_tokens, stop tokens, logprobs and aborts — the server's output path without a model."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from osserve.engine.core.outputs import CompletionDelta, EngineStats, TokenLogprob
from osserve.engine.core.sampling_params import SamplingParams
from osserve.errors import ContextLengthError
from osserve.tokenizer import load_tokenizer


class ScriptedEngine:
    """Replays `script` for every request, or, while `queue` holds scripts, the next of them (one
    per request: the steps of a response that calls the server's tools)."""

    def __init__(self, script: list[int] | None = None, max_model_len: int = 4096, delay: float = 0.0) -> None:
        self.script = list(script or [])
        self.queue: list[list[int]] = []
        self._max_model_len = max_model_len
        self.delay = delay
        self.aborted: list[str] = []
        self.prompts: list[list[int]] = []
        self.params: list[SamplingParams] = []
        self.generated = 0

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def is_ready(self) -> bool:
        return True

    def stats(self) -> EngineStats:
        return EngineStats(generation_tokens_total=self.generated)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def generate(self, prompt_token_ids: list[int], params: SamplingParams,
                       request_id: str) -> AsyncIterator[CompletionDelta]:
        params.validate()
        if len(prompt_token_ids) + (params.max_tokens or 1) > self.max_model_len:
            raise ContextLengthError("too long", "max_tokens")
        self.prompts.append(list(prompt_token_ids))
        self.params.append(params)
        tok = load_tokenizer()
        script = self.queue.pop(0) if self.queue else self.script
        limit = params.max_tokens or len(script)
        finished = False
        try:
            for i, t in enumerate(script[:limit]):
                if self.delay:
                    await asyncio.sleep(self.delay)
                self.generated += 1
                stop = t in params.stop_token_ids and not params.ignore_eos
                last = stop or i + 1 == limit or i + 1 == len(script)
                finished = last
                yield CompletionDelta(
                    request_id=request_id, new_token_ids=[t],
                    new_text="" if stop else tok.decode([t]), new_logprobs=_logprobs(t, params), finished=last,
                    finish_reason=("stop" if stop or i + 1 == len(script) else "length") if last else None,
                    stop_reason=t if stop else None, num_prompt_tokens=len(prompt_token_ids),
                    num_cached_tokens=16, num_output_tokens=i + 1,
                )
                if last:
                    return
        finally:
            if not finished:
                self.aborted.append(request_id)


def _logprobs(token: int, params: SamplingParams) -> list[TokenLogprob] | None:
    """Made-up but well-formed: the chosen token first, then `logprobs` neighbours, decreasing."""
    if params.logprobs is None:
        return None
    top = [(token + k, -0.25 * (k + 1)) for k in range(params.logprobs)]
    return [TokenLogprob(token, -0.25, top)]
