"""Turning sampled tokens into what callers see: incremental text, stop strings, logprobs.

Stop strings are matched on the decoded text, so they are found across token boundaries; the
text held back is only what could still be the start of a stop string, and the stop string
itself is never shown.
"""

from __future__ import annotations

from dataclasses import dataclass

from osserve.engine.core.outputs import CompletionDelta, TokenLogprob
from osserve.engine.core.request import Request
from osserve.engine.core.scheduler import RequestUpdate
from osserve.tokenizer import IncrementalDecoder, Tokenizer


@dataclass
class _TextState:
    decoder: IncrementalDecoder
    stop: list[str]
    pending: str = ""  # decoded, not yet shown: it may be the start of a stop string


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.states: dict[str, _TextState] = {}

    def add(self, req: Request) -> None:
        self.states[req.request_id] = _TextState(
            IncrementalDecoder(self.tokenizer), list(req.sampling_params.stop)
        )

    def remove(self, request_id: str) -> None:
        self.states.pop(request_id, None)

    def process(
        self, req: Request, upd: RequestUpdate, logprob: TokenLogprob | None
    ) -> CompletionDelta | None:
        """The delta for one request's step; None when it produced nothing new."""
        state = self.states[req.request_id]
        if not state.stop and not upd.finished and upd.new_token_ids:
            return self._plain_delta(req, upd, state, logprob)
        return self._general_delta(req, upd, state, logprob)

    def _general_delta(self, req: Request, upd: RequestUpdate, state: _TextState,
                       logprob: TokenLogprob | None) -> CompletionDelta | None:
        new_ids = list(upd.new_token_ids)
        # A stop token ends the output; its text is not part of it.
        visible = new_ids[:-1] if upd.finished and upd.stop_reason in new_ids[-1:] else new_ids
        text = state.pending + state.decoder.push(visible)
        finished, reason, stop_reason = upd.finished, upd.finish_reason, upd.stop_reason
        hit = self._find_stop(text, state.stop)
        if hit is not None:
            cut, stop_str = hit
            text, finished, reason, stop_reason = text[:cut], True, "stop", stop_str
            state.pending = ""
        elif finished:
            text += state.decoder.flush()
            state.pending = ""
        else:
            hold = self._held_back(text, state.stop)
            text, state.pending = text[: len(text) - hold], text[len(text) - hold:]
        if not new_ids and not finished:
            return None
        return CompletionDelta(
            request_id=req.request_id,
            new_token_ids=new_ids,
            new_text=text,
            new_logprobs=[logprob] if logprob is not None and new_ids else None,
            finished=finished,
            finish_reason=reason if finished else None,
            stop_reason=stop_reason if finished else None,
            num_prompt_tokens=req.num_prompt_tokens,
            num_cached_tokens=req.num_cached_tokens,
            num_output_tokens=req.num_output_tokens,
            queue_time=req.queue_time if finished else None,
        )

    @staticmethod
    def _plain_delta(req: Request, upd: RequestUpdate, state: _TextState,
                     logprob: TokenLogprob | None) -> CompletionDelta:
        """process() for most steps of most requests: new tokens, not the last, no stop strings (so
        no text is held back: state.pending stays empty). Skips the stop-string search."""
        return CompletionDelta(
            req.request_id, upd.new_token_ids, state.decoder.push(upd.new_token_ids),
            [logprob] if logprob is not None else None, False, None, None,
            req.num_prompt_tokens, req.num_cached_tokens, req.num_output_tokens,
        )

    def finish(self, req: Request, reason: str, error: str | None = None) -> CompletionDelta:
        """The last delta of a request ended from outside (abort, error, a grammar's dead end)."""
        return CompletionDelta(
            request_id=req.request_id, new_token_ids=[], new_text="", new_logprobs=None,
            finished=True, finish_reason=reason, stop_reason=None,
            num_prompt_tokens=req.num_prompt_tokens, num_cached_tokens=req.num_cached_tokens,
            num_output_tokens=req.num_output_tokens, error=error,
        )

    @staticmethod
    def _find_stop(text: str, stops: list[str]) -> tuple[int, str] | None:
        hits = [(text.find(s), s) for s in stops if s in text]
        return min(hits) if hits else None

    @staticmethod
    def _held_back(text: str, stops: list[str]) -> int:
        """Length of the longest tail of `text` that is a proper prefix of some stop string."""
        best = 0
        for s in stops:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best
