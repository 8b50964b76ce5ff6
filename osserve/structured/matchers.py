"""The engine's grammars: each constrained request's llguidance matcher, compiled off the step
loop, fed every token the request samples, and asked each step for its token mask.

Compiling takes a few ms for a typical schema (up to seconds for pathological ones) and the
vocabulary once ~1 s: both run in a worker thread (llguidance drops the GIL), and a request joins
the scheduler only once its matcher is ready, so a new schema never stalls the requests already
running. Compiled grammars are cached by their text (a server sees the same few schemas over and
over); each request gets a copy. (Copying a cached grammar on the step loop instead of in the
worker made serving slower: BENCHMARKS.md, experiments not kept.)

Masks of a step's rows are filled in parallel by llguidance's own threads into one host buffer (a
32-bit word per 32 tokens, bit set = allowed), started from a worker thread so that the engine can
turn the step before's tokens into deltas meanwhile (begin_masks / end_masks).

Most rows of a reasoning model's batch are in free text (the analysis channel), whose mask is the
same at almost every step (free_text.py says where), and many more have finished their grammar and
may only repeat a stop token. Those rows skip llguidance: each takes its grammar's mask for that
state, learnt from llguidance the first time a request of the grammar is there and kept with the
compiled grammar, and copied into its buffer row only when the row held another mask the step
before. The rows llguidance fills come first in the buffer. Such a row's token was drawn from the
grammar's own mask, so its matcher need not check it at once: free text's tokens wait in a list and
reach the matcher in one call when the row next needs it, and a finished grammar's stop tokens
(which change nothing) are not fed at all.

A JSON-schema answer whose strings' maxLength can be taken out of the grammar (length_bounds.py)
gets a second matcher, of the grammar without them, which fills its masks; its JsonCursor then
clears the tokens that would overflow a bound (bounded.py). The first matcher, with the bounds,
still judges every token (those drawn from the fast matcher's masks in one call, when next it fills
a mask or the answer ends), and fills the mask where the cursor cannot tell (inside an escape).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from osserve.structured.bounded import Bounded
from osserve.structured.free_text import FreeText, Phase
from osserve.structured.grammar import BoundedAnswer
from osserve.structured.json_cursor import JsonCursor, vocabulary_runs
from osserve.structured.vocabulary import harmony_lltokenizer, token_bytes, utf8_shapes

if TYPE_CHECKING:
    from llguidance import LLExecutor, LLMatcher

CACHE_SIZE = 256  # compiled grammars kept (a few hundred KB each at most, their shared masks 25 KB each)
# llguidance's mask threads: half the cores, at most 8. Its default (80% of the cores) contends with
# the HTTP processes and the engine's own thread on a serving host. OSSERVE_MASK_THREADS overrides it
# (read once at import; benchmarks/structured_ab.sh compares settings).
MASK_THREADS = int(os.environ.get("OSSERVE_MASK_THREADS", 0)) or max(1, min(8, (os.cpu_count() or 2) // 2))


STOPPED = b""  # the key of a finished grammar's mask (a free channel's key is its name, never empty)


@dataclass
class Compiled:
    """A grammar compiled once: the matcher each request copies, and the masks its requests share
    (free channels' and the finished grammar's), learnt as the requests reach those states."""

    template: LLMatcher
    masks: dict[bytes, torch.Tensor] = field(default_factory=dict)


@dataclass
class GrammarState:
    matcher: LLMatcher
    masks: dict[bytes, torch.Tensor]  # its Compiled's
    free: FreeText | None = None  # where it stands in its free channels (None: the grammar has none)
    failed: str | None = None  # why the grammar cannot go on: the request ends with finish reason "grammar"
    bounded: Bounded | None = None
    key: bytes | None = None  # the shared mask the next token takes (Grammars.next_key), None: llguidance's
    behind: list[int] = field(default_factory=list)  # accepted tokens the matcher has yet to see (accept says when)


@dataclass
class MaskFill:
    """A step's masks under way (Grammars.begin_masks): the rows in buffer order (llguidance's
    first), the buffer, llguidance's rows with their states, the bounded ones among them by slot,
    and the worker's fill (None: every row took a shared mask)."""

    rows: list[int]
    bits: torch.Tensor
    filled: list[tuple[int, GrammarState]]
    fast: dict[int, Bounded]
    future: Future[None] | None


@dataclass
class StepMasks:
    """One step's masks: `rows` (indices into the step's sampled rows, in no particular order) and
    their bits, [len(rows), W] int32 on the host. `dead` holds the rows whose grammar allows no token
    at all."""

    rows: list[int]
    bits: torch.Tensor
    dead: list[int]


class Grammars:
    def __init__(self, vocab_size: int, pin_memory: bool = False, shared_masks: bool = True) -> None:
        """shared_masks: give free-text and finished rows their grammar's shared mask (False: every
        row from llguidance, as a reference)."""
        self.words = (vocab_size + 31) // 32
        self.pin_memory = pin_memory
        self.shared_masks = shared_masks
        self._compiler = ThreadPoolExecutor(1, thread_name_prefix="osserve-grammar")
        self._cache: OrderedDict[str, Compiled] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._pending: dict[str, tuple[Future[tuple[LLMatcher, Compiled, LLMatcher | None]], dict[str, int | None],
                                       BoundedAnswer | None]] = {}
        self.states: dict[str, GrammarState] = {}
        self._executor: LLExecutor | None = None  # llguidance's mask threads, made by the filler on first use
        self._filler = ThreadPoolExecutor(1, thread_name_prefix="osserve-masks")
        self._buffer = torch.empty(0, self.words, dtype=torch.int32)
        self._holds: list[torch.Tensor | None] = []  # the shared mask each buffer row holds, if any

    # ------------------------------------------------------------------ compiling
    def start(self, request_id: str, grammar: str, free: dict[str, int | None] | None = None,
              bounded: BoundedAnswer | None = None) -> None:
        """Compile (or copy from the cache) in the worker thread; `ready` hands the result over.
        free: the grammar's free channels and their budgets (grammar.free_channels); bounded: the
        answer's string bounds taken out (grammar.bounded_answer)."""
        self._pending[request_id] = (self._compiler.submit(self._compile_request, grammar, bounded), free or {},
                                     bounded)

    def _compile_request(self, grammar: str, bounded: BoundedAnswer | None
                         ) -> tuple[LLMatcher, Compiled, LLMatcher | None]:
        matcher, compiled = self._compile(grammar)
        if bounded is None:
            return matcher, compiled, None
        vocabulary_runs()  # built once, here rather than on the step loop
        fast, _ = self._compile(bounded.grammar)
        return matcher, compiled, fast

    def _compile(self, grammar: str) -> tuple[LLMatcher, Compiled]:
        from llguidance import LLMatcher

        utf8_shapes(), token_bytes()  # built once, here rather than on the step loop
        with self._cache_lock:
            compiled = self._cache.get(grammar)
            if compiled is not None:
                self._cache.move_to_end(grammar)
        if compiled is None:
            text = grammar if grammar.startswith("{") else LLMatcher.grammar_from_lark(grammar)
            compiled = Compiled(LLMatcher(harmony_lltokenizer(), text, log_level=0))
            with self._cache_lock:
                self._cache[grammar] = compiled
                while len(self._cache) > CACHE_SIZE:
                    self._cache.popitem(last=False)
        return compiled.template.deep_copy(), compiled

    def ready(self, wait: bool = False) -> list[tuple[str, str | None]]:
        """The requests whose grammar finished compiling, each with None or the error that stops it
        (a grammar llguidance rejects). wait: block for every pending one (nothing else to do)."""
        done: list[tuple[str, str | None]] = []
        for rid, (future, free, answer) in list(self._pending.items()):
            if not (wait or future.done()):
                continue
            del self._pending[rid]
            try:
                matcher, compiled, fast = future.result()
            except Exception as e:  # noqa: BLE001 - the library's errors are not typed
                done.append((rid, f"the output grammar could not be built: {e}"))
                continue
            if matcher.is_error():
                done.append((rid, f"the output grammar could not be built: {matcher.get_error()}"))
                continue
            budgets = {name.encode(): budget for name, budget in free.items()}
            bounded = None
            if fast is not None and answer is not None and not fast.is_error():
                # A raw completion's answer is its whole output: the cursor reads from the start.
                bounded = Bounded(fast, answer, None if answer.harmony else JsonCursor(answer.bounds))
            state = GrammarState(matcher, compiled.masks, FreeText(budgets, utf8_shapes()) if budgets else None,
                                 bounded=bounded)
            state.key = self.next_key(state, None)
            self.states[rid] = state
            done.append((rid, None))
        return done

    @staticmethod
    def prepare() -> None:
        """Build the vocabulary's tables now (~1-2 s of Python), not in the compile worker beside the
        first requests that need them: there they held the GIL against the step loop."""
        harmony_lltokenizer(), utf8_shapes(), token_bytes(), vocabulary_runs()

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def drop(self, request_id: str) -> None:
        pending = self._pending.pop(request_id, None)
        if pending is not None:
            pending[0].cancel()
        self.states.pop(request_id, None)

    # ------------------------------------------------------------------ stepping
    def accept(self, sampled: dict[str, int]) -> set[str]:
        """Feed each constrained request the token it sampled (once, in order); returns the requests
        whose grammar rejected it."""
        rejected = set()
        for rid, token in sampled.items():
            state = self.states.get(rid)
            if state is None or state.failed is not None or state.key == STOPPED and STOPPED in state.masks:
                continue  # a finished grammar's stop token: its state stays as it is
            bounded = state.bounded
            if bounded is not None and (not bounded.feed(token) or bounded.done):
                state.bounded = bounded = None  # the bounded grammar alone from now
            free = state.free
            channel = None
            if free is not None and free.phase is not Phase.OFF:
                free.feed(token, token_bytes()[token] if free.in_header else None)
                channel = free.free_channel()
            if channel is not None and channel in state.masks or bounded is not None and bounded.fills:
                # The next mask is known without the matcher (a shared one, or the fast matcher's
                # with the cursor's bounds): it may wait.
                state.behind.append(token)
                state.key = channel
                continue
            behind = state.behind
            if behind:
                behind.append(token)
                ok = state.matcher.consume_tokens(behind)
                state.behind = []
            else:
                ok = state.matcher.consume_token(token)
            if not ok:
                which = f"one of the tokens {behind}" if behind else f"token {token}"
                state.failed = f"the output grammar rejected {which}: {state.matcher.get_error()}"
                rejected.add(rid)
                continue
            state.key = self.next_key(state, channel)
        return rejected

    def next_key(self, state: GrammarState, channel: bytes | None) -> bytes | None:
        """The key of the shared mask the state's next token takes (its free channel's, or STOPPED),
        or None: llguidance fills it. channel: the free channel the state is in (FreeText's)."""
        if not self.shared_masks:
            return None
        if channel is not None:
            return channel
        if state.matcher.is_stopped() and not state.matcher.is_error():
            return STOPPED
        return None

    def masks(self, request_ids: list[str]) -> StepMasks | None:
        """The masks of the step's rows that are constrained (None: no row is)."""
        fill = self.begin_masks(request_ids)
        return self.end_masks(fill) if fill is not None else None

    def begin_masks(self, request_ids: list[str]) -> MaskFill | None:
        """Start the step's masks: llguidance fills its rows in a worker thread (it drops the GIL),
        the shared masks are copied here meanwhile; end_masks waits for the rest. Between the two
        the caller may do other work, but must not feed the matchers (None: no row is constrained)."""
        filled: list[tuple[int, GrammarState]] = []  # (row, state): llguidance fills these
        shared: list[tuple[int, torch.Tensor]] = []  # (row, the grammar's shared mask)
        for row, rid in enumerate(request_ids):
            state = self.states.get(rid)
            if state is None or state.failed is not None:
                continue  # unconstrained (a complete grammar still is: its mask allows the stop tokens only)
            mask = state.masks.get(state.key) if state.key is not None else None
            if mask is None:
                filled.append((row, state))
            else:
                shared.append((row, mask))
        n = len(filled) + len(shared)
        if not n:
            return None
        if self._buffer.shape[0] < n:
            self._buffer = torch.empty(max(n, 2 * self._buffer.shape[0]), self.words, dtype=torch.int32,
                                       pin_memory=self.pin_memory)
            self._holds = [None] * self._buffer.shape[0]
        bits = self._buffer[:n]
        # A bounded answer's row is filled by its fast matcher, then its cursor clears what overflows.
        fast = {slot: b for slot, (_, state) in enumerate(filled) if (b := state.bounded) is not None and b.fills}
        future = None
        if filled:
            matchers = [(fast[slot].fast if slot in fast else state.matcher, slot)
                        for slot, (_, state) in enumerate(filled)]
            future = self._filler.submit(self._fill, matchers, bits)
        # llguidance's rows first; then the shared ones, those of one mask together, so that a buffer
        # row mostly holds the same mask as the step before (and is not copied again).
        shared.sort(key=lambda row_mask: id(row_mask[1]))
        holds = self._holds
        for slot, (_, mask) in enumerate(shared, len(filled)):
            if holds[slot] is not mask:
                bits[slot].copy_(mask)
                holds[slot] = mask
        return MaskFill([row for row, _ in filled] + [row for row, _ in shared], bits, filled, fast, future)

    def _fill(self, matchers: list[tuple[LLMatcher, int]], bits: torch.Tensor) -> None:
        from llguidance.torch import fill_next_token_bitmask_par

        if self._executor is None:
            from llguidance import LLExecutor

            self._executor = LLExecutor(MASK_THREADS)
        fill_next_token_bitmask_par(self._executor, matchers, bits)

    def end_masks(self, fill: MaskFill) -> StepMasks:
        """Wait for llguidance's rows; clear what overflows a string bound; note the rows whose
        grammar allows nothing, and learn the shared masks met for the first time."""
        if fill.future is not None:
            fill.future.result()
        bits, filled = fill.bits, fill.filled
        rows = bits.numpy()  # numpy rows: torch's indexing costs microseconds a row
        runs = vocabulary_runs() if fill.fast else None
        for slot, bounded in fill.fast.items():
            assert runs is not None and bounded.cursor is not None
            runs.clear_overflows(bounded.cursor, rows[slot], bounded.answer.bounds.smallest)
        dead = []
        if filled:
            nonempty = _nonempty(rows[: len(filled)])
            for slot, (row, state) in enumerate(filled):
                self._holds[slot] = None
                if state.matcher.is_error() or not nonempty[slot]:
                    state.failed = "the output grammar allows no next token" + (
                        f": {state.matcher.get_error()}" if state.matcher.is_error() else "")
                    dead.append(row)
                elif state.key is not None and state.key not in state.masks:  # learnt: the grammar's mask there
                    state.masks[state.key] = bits[slot].clone()
        return StepMasks(fill.rows, bits, dead)

    def failure(self, request_id: str) -> str | None:
        state = self.states.get(request_id)
        return state.failed if state is not None else None


def _nonempty(rows: np.ndarray) -> list[bool]:
    """Whether each mask row allows any token. numpy, not torch (torch's intra-op threads on a busy
    host made this small scan take ms); an OR over 64-bit words of each row's first 4,096 tokens,
    where almost every mask allows some (digits, punctuation, common words), and over the whole
    row only where those are all clear."""
    words = rows.view(np.int64) if rows.shape[1] % 2 == 0 else rows
    nonempty = np.bitwise_or.reduce(words[:, :64], axis=1) != 0
    unsure = np.flatnonzero(~nonempty)
    if len(unsure):
        nonempty[unsure] = np.bitwise_or.reduce(words[unsure], axis=1) != 0
    return nonempty.tolist()
