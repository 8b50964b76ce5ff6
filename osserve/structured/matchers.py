"""The engine's grammars: each constrained request's llguidance matcher, compiled off the step
loop, fed every token the request samples, and asked each step for its token mask.

Compiling takes a few ms for a typical schema (up to seconds for pathological ones) and the
vocabulary once ~1 s: both run in a worker thread (llguidance drops the GIL), and a request joins
the scheduler only once its matcher is ready, so a new schema never stalls the requests already
running. Compiled grammars are cached by their text (a server sees the same few schemas over and
over); each request gets a copy. Masks of a step's rows are filled in parallel by llguidance's own
threads into one host buffer: a 32-bit word per 32 tokens, bit set = allowed.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from osserve.structured.vocabulary import harmony_lltokenizer

if TYPE_CHECKING:
    from llguidance import LLExecutor, LLMatcher

CACHE_SIZE = 256  # compiled grammars kept (a few hundred KB each at most)
# llguidance's mask threads: half the cores, at most 8. Its default (80% of the cores) contends with
# the HTTP processes and the engine's own thread on a serving host.
MASK_THREADS = max(1, min(8, (os.cpu_count() or 2) // 2))


@dataclass
class GrammarState:
    matcher: LLMatcher
    failed: str | None = None  # why the grammar cannot go on: the request ends with finish reason "grammar"


@dataclass
class StepMasks:
    """One step's masks: `rows` (indices into the step's sampled rows) and their bits, [len(rows), W]
    int32 on the host. `dead` holds the rows whose grammar allows no token at all."""

    rows: list[int]
    bits: torch.Tensor
    dead: list[int]


class Grammars:
    def __init__(self, vocab_size: int, pin_memory: bool = False) -> None:
        self.words = (vocab_size + 31) // 32
        self.pin_memory = pin_memory
        self._compiler = ThreadPoolExecutor(1, thread_name_prefix="osserve-grammar")
        self._cache: OrderedDict[str, LLMatcher] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._pending: dict[str, Future[LLMatcher]] = {}
        self.states: dict[str, GrammarState] = {}
        self._executor: LLExecutor | None = None
        self._buffer = torch.empty(0, self.words, dtype=torch.int32)

    # ------------------------------------------------------------------ compiling
    def start(self, request_id: str, grammar: str) -> None:
        """Compile (or copy from the cache) in the worker thread; `ready` hands the result over."""
        self._pending[request_id] = self._compiler.submit(self._compile, grammar)

    def _compile(self, grammar: str) -> LLMatcher:
        from llguidance import LLMatcher

        with self._cache_lock:
            template = self._cache.get(grammar)
            if template is not None:
                self._cache.move_to_end(grammar)
        if template is None:
            text = grammar if grammar.startswith("{") else LLMatcher.grammar_from_lark(grammar)
            template = LLMatcher(harmony_lltokenizer(), text, log_level=0)
            with self._cache_lock:
                self._cache[grammar] = template
                while len(self._cache) > CACHE_SIZE:
                    self._cache.popitem(last=False)
        return template.deep_copy()

    def ready(self, wait: bool = False) -> list[tuple[str, str | None]]:
        """The requests whose grammar finished compiling, each with None or the error that stops it
        (a grammar llguidance rejects). wait: block for every pending one (nothing else to do)."""
        done: list[tuple[str, str | None]] = []
        for rid, future in list(self._pending.items()):
            if not (wait or future.done()):
                continue
            del self._pending[rid]
            try:
                matcher = future.result()
            except Exception as e:  # noqa: BLE001 - the library's errors are not typed
                done.append((rid, f"the output grammar could not be built: {e}"))
                continue
            if matcher.is_error():
                done.append((rid, f"the output grammar could not be built: {matcher.get_error()}"))
                continue
            self.states[rid] = GrammarState(matcher)
            done.append((rid, None))
        return done

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def drop(self, request_id: str) -> None:
        future = self._pending.pop(request_id, None)
        if future is not None:
            future.cancel()
        self.states.pop(request_id, None)

    # ------------------------------------------------------------------ stepping
    def accept(self, sampled: dict[str, int]) -> set[str]:
        """Feed each constrained request the token it sampled (once, in order); returns the requests
        whose grammar rejected it."""
        rejected = set()
        for rid, token in sampled.items():
            state = self.states.get(rid)
            if state is None or state.failed is not None:
                continue
            if not state.matcher.consume_token(token):
                state.failed = f"the output grammar rejected token {token}: {state.matcher.get_error()}"
                rejected.add(rid)
        return rejected

    def constrains(self, request_id: str) -> bool:
        """Whether the request's next token is masked. A grammar that is complete still is: its mask
        then allows only the stop tokens (a finished JSON object is not followed by free text)."""
        state = self.states.get(request_id)
        return state is not None and state.failed is None

    def masks(self, request_ids: list[str]) -> StepMasks | None:
        """The masks of the step's rows that are constrained (None: no row is)."""
        rows = [i for i, rid in enumerate(request_ids) if self.constrains(rid)]
        if not rows:
            return None
        from llguidance.torch import fill_next_token_bitmask_par

        if self._buffer.shape[0] < len(rows):
            self._buffer = torch.empty(max(len(rows), 2 * self._buffer.shape[0]), self.words, dtype=torch.int32,
                                       pin_memory=self.pin_memory)
        if self._executor is None:
            from llguidance import LLExecutor

            self._executor = LLExecutor(MASK_THREADS)
        bits = self._buffer[: len(rows)]
        matchers = [(self.states[request_ids[row]].matcher, k) for k, row in enumerate(rows)]
        fill_next_token_bitmask_par(self._executor, matchers, bits)
        # numpy, not torch: torch's intra-op threads on a busy host made this small scan take ms.
        empty = (np.count_nonzero(bits.numpy(), axis=1) == 0).tolist()
        dead = []
        for k, row in enumerate(rows):
            state = self.states[request_ids[row]]
            if state.matcher.is_error() or empty[k]:
                state.failed = "the output grammar allows no next token" + (
                    f": {state.matcher.get_error()}" if state.matcher.is_error() else "")
                dead.append(row)
        return StepMasks(rows, bits, dead)

    def failure(self, request_id: str) -> str | None:
        state = self.states.get(request_id)
        return state.failed if state is not None else None
