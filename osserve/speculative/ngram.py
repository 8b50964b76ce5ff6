"""Prompt lookup (n-gram) drafts: the tokens that followed the last place the request's own text
(prompt and output so far) ended the way it ends now.

For n from prompt_lookup_max down to prompt_lookup_min, the last n tokens are searched for earlier
in the text; at the latest earlier match, the up to k tokens after it are the draft (a chain). No
model, no device: numpy over each request's tokens, kept as a growing array so a step costs a
vectorised scan of the text, not a Python loop over it.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


class NgramProposer:
    def __init__(self, num_tokens: int, n_min: int, n_max: int) -> None:
        self.k, self.n_min, self.n_max = num_tokens, n_min, n_max
        self.texts: dict[str, np.ndarray] = {}  # request id -> its tokens (a prefix of them may be stale)

    def propose(self, request_id: str, tokens: list[int], limit: int | None = None) -> list[int]:
        """Up to min(k, limit) draft tokens after `tokens` (the request's whole text)."""
        k = self.k if limit is None else min(self.k, limit)
        if k <= 0:
            return []
        text = self._text(request_id, tokens)
        length = len(text)
        for n in range(min(self.n_max, length - 1), self.n_min - 1, -1):
            suffix = text[length - n:]
            # Windows starting at 0 .. length - n - 1: every earlier n-gram, not the suffix itself.
            windows = sliding_window_view(text[: length - 1], n)
            hits = np.flatnonzero((windows == suffix).all(axis=1))
            if len(hits):
                start = int(hits[-1]) + n
                return text[start: start + k].tolist()
        return []

    def _text(self, request_id: str, tokens: list[int]) -> np.ndarray:
        cached = self.texts.get(request_id)
        n = len(tokens)
        if cached is None or len(cached) > n or (len(cached) and cached[-1] != tokens[len(cached) - 1]):
            cached = np.asarray(tokens, dtype=np.int64)
        elif len(cached) < n:
            cached = np.concatenate([cached, np.asarray(tokens[len(cached):], dtype=np.int64)])
        self.texts[request_id] = cached
        return cached

    def drop(self, request_id: str) -> None:
        self.texts.pop(request_id, None)
