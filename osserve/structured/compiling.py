"""Compiling constrained requests' grammars off the step loop, and keeping them.

Compiling takes a few ms for a typical schema (up to seconds for pathological ones) and the
vocabulary once ~1 s: both run in a worker thread (llguidance drops the GIL), and a request joins
the scheduler only once its matcher is ready (matchers.Grammars.ready), so a new schema never
stalls the requests already running. Compiled grammars are cached by their text (a server sees the
same few schemas over and over); each request gets a copy, made at once where the copy's lane is
compiled already.

A grammar is compiled once per mask lane (matchers.py says why: copies of one compiled grammar
share its lexer, behind a lock), each lane when a request first needs it, and request n of a
grammar copies lane n mod the lanes.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from osserve.structured.grammar import BoundedAnswer, bounded_answer, free_channels, grammar_text
from osserve.structured.json_cursor import vocabulary_runs
from osserve.structured.spec import StructuredOutputs
from osserve.structured.vocabulary import harmony_lltokenizer, token_bytes, utf8_shapes

if TYPE_CHECKING:
    from llguidance import LLMatcher

CACHE_SIZE = 256  # compiled grammars kept (a few hundred KB each at most, their shared masks 25 KB each)
SLOW_COMPILE_S = 0.05  # a grammar that took longer to compile keeps one mask lane (GrammarCompiler._copy)


@dataclass
class Compiled:
    """A grammar compiled once per mask lane: the matchers its requests copy (lane n mod
    len(lanes) for its n-th request; None: that lane not compiled yet), and the masks its requests
    share (free channels' and the finished grammar's), learnt as the requests reach those states."""

    lanes: list[LLMatcher | None]
    masks: dict[bytes, torch.Tensor] = field(default_factory=dict)
    copies: int = 0  # requests that copied it so far


@dataclass(frozen=True)
class Prepared:
    """What the engine starts a request's grammar from (GrammarCompiler.grammar_for): its text, its
    free channels with their budgets, its bounded answer."""

    text: str
    free: dict[str, int | None]
    bounded: BoundedAnswer | None


@dataclass(frozen=True)
class Copies:
    """A request's matchers: its grammar's (and its bounded answer's fast one, from the same lane),
    the compiled grammar they were copied from, and the lane."""

    matcher: LLMatcher
    compiled: Compiled
    fast: LLMatcher | None
    lane: int


class GrammarCompiler:
    def __init__(self, lanes: int) -> None:
        self.num_lanes = lanes
        self._compiler = ThreadPoolExecutor(1, thread_name_prefix="osserve-grammar")
        self._cache: OrderedDict[str, Compiled] = OrderedDict()
        self._prepared: OrderedDict[tuple[str, int | None], Prepared] = OrderedDict()  # by (repr(spec), max_tokens)
        self._cache_lock = threading.Lock()

    def grammar_for(self, spec: StructuredOutputs, max_tokens: int | None) -> Prepared | None:
        """The spec's grammar text, free channels and bounded answer (None: nothing is constrained),
        remembered by the spec's repr: a server's requests repeat a few specs, and working them out
        took ~60 µs of the step loop a request (the bounded answer most), ~15 ms for a burst of 256."""
        key = (repr(spec), max_tokens)
        prepared = self._prepared.get(key)
        if prepared is None:
            text = grammar_text(spec, max_tokens)
            if text is None:
                return None
            prepared = Prepared(text, free_channels(spec, max_tokens), bounded_answer(spec, max_tokens))
            self._prepared[key] = prepared
            while len(self._prepared) > CACHE_SIZE:
                self._prepared.popitem(last=False)
        else:
            self._prepared.move_to_end(key)
        return prepared

    def submit(self, grammar: str, bounded: BoundedAnswer | None) -> Future[Copies]:
        """A request's copies: made here where its lane is compiled already, else by the worker
        thread. bounded: the answer's string bounds taken out (grammar.bounded_answer)."""
        copies = self._copy_cached(grammar, bounded)
        if copies is None:
            return self._compiler.submit(self._compile_request, grammar, bounded)
        future: Future[Copies] = Future()
        future.set_result(copies)
        return future

    def _copy_cached(self, grammar: str, bounded: BoundedAnswer | None) -> Copies | None:
        """_compile_request's result made here, where the lane the request gets is compiled already
        (its bounded answer's too): copies take microseconds, while the worker would first wait for
        the GIL, and the request would miss the step that `ready` was next asked in (a step of
        TTFT). None: the worker compiles."""
        with self._cache_lock:
            compiled = self._cache.get(grammar)
            answer = self._cache.get(bounded.grammar) if bounded is not None else None
            if compiled is None or bounded is not None and answer is None:
                return None
            lane = compiled.copies % len(compiled.lanes)
            template = compiled.lanes[lane]
            fast = answer.lanes[lane % len(answer.lanes)] if answer is not None else None
            if template is None or answer is not None and fast is None:
                return None
            compiled.copies += 1
            self._cache.move_to_end(grammar)
        return Copies(template.deep_copy(), compiled, fast.deep_copy() if fast is not None else None, lane)

    def _compile_request(self, grammar: str, bounded: BoundedAnswer | None) -> Copies:
        compiled = self._compiled(grammar)
        with self._cache_lock:  # _copy_cached takes lanes too
            lane = compiled.copies % len(compiled.lanes)
            compiled.copies += 1
        matcher = self._copy(compiled, grammar, lane)
        if bounded is None:
            return Copies(matcher, compiled, None, lane)
        vocabulary_runs()  # built once, here rather than on the step loop
        answer = self._compiled(bounded.grammar)
        fast = self._copy(answer, bounded.grammar, lane % len(answer.lanes))
        return Copies(matcher, compiled, fast, lane)

    def _compiled(self, grammar: str) -> Compiled:
        with self._cache_lock:
            compiled = self._cache.get(grammar)
            if compiled is not None:
                self._cache.move_to_end(grammar)
                return compiled
            compiled = self._cache[grammar] = Compiled([None] * self.num_lanes)
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled

    def _copy(self, compiled: Compiled, grammar: str, lane: int) -> LLMatcher:
        """A copy of the grammar's matcher of that lane, compiling the lane first where it is new.
        A grammar whose first compile took over SLOW_COMPILE_S keeps that one lane: its next
        requests would each wait as long for theirs. (Only the compile worker calls this: a lane is
        compiled once.)"""
        from llguidance import LLMatcher

        template = compiled.lanes[lane]
        if template is None:
            tokenizer, _, _ = harmony_lltokenizer(), utf8_shapes(), token_bytes()  # built once, off the step loop
            first, start = all(t is None for t in compiled.lanes), time.perf_counter()
            text = grammar if grammar.startswith("{") else LLMatcher.grammar_from_lark(grammar)
            template = compiled.lanes[lane] = LLMatcher(tokenizer, text, log_level=0)
            if first and time.perf_counter() - start > SLOW_COMPILE_S:
                with self._cache_lock:  # _copy_cached reads the lanes under it
                    compiled.lanes[:] = [template]
        return template.deep_copy()

    @staticmethod
    def prepare() -> None:
        """Build the vocabulary's tables now (~1-2 s of Python), not in the compile worker beside the
        first requests that need them: there they held the GIL against the step loop."""
        harmony_lltokenizer(), utf8_shapes(), token_bytes(), vocabulary_runs()
