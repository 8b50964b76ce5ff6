"""The engine's grammars: each constrained request's llguidance matcher, compiled off the step
loop (compiling.py), fed every token the request samples, and asked each step for its token mask.

Masks of a step's rows are filled in parallel by llguidance (it drops the GIL) into one host buffer
(a 32-bit word per 32 tokens, bit set = allowed), while the engine turns the step before's tokens
into deltas (begin_masks / end_masks). Copies of one compiled grammar share its lexer, behind a
lock that a mask's computation holds: filled from many threads, they took turns (CPU, 128 JSON
rows: 2 threads slower than 1; the serving host waited ~1.5 ms a step for 8 threads). So a grammar
is compiled once per mask lane (MASK_THREADS of them, each compiled when a request first needs
it; compiling.py), request n of a grammar copies lane n mod MASK_THREADS, and each lane's rows are
filled by a thread of their own: no two threads share a lexer.

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
clears the tokens that would overflow a bound (bounded.py). Inside a value string whose characters
are free, that matcher's mask depends on the string's position in the answer alone: rows there take
their position's shared mask (JsonCursor.position_key), learnt from the first fill there, and their
overflows are cleared on their copy (on the CPU, bench_masks' json turn: 0.18 -> 0.05 ms a row
there, benchmarks/diag/fill_by_state.py). The first matcher, with the bounds,
still judges every token (those drawn from the fast matcher's masks in one call, when next it fills
a mask or the answer ends), and fills the mask where the cursor cannot tell (inside an escape). The
fast matcher is fed its tokens in the mask thread of its lane, just before it fills the row's mask:
on the step loop each token took ~4 us of a serving host's time (H100, 2026-11-26, py-spy).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from osserve.structured.bounded import Bounded
from osserve.structured.compiling import Copies, GrammarCompiler, Prepared
from osserve.structured.free_text import FreeText, Phase
from osserve.structured.grammar import BoundedAnswer
from osserve.structured.json_cursor import POSITION, JsonCursor, vocabulary_runs
from osserve.structured.spec import StructuredOutputs
from osserve.structured.vocabulary import token_bytes, utf8_shapes

if TYPE_CHECKING:
    from llguidance import LLExecutor, LLMatcher

# Mask lanes (a thread and a compiled copy of each grammar each): 2 (1 on a host of 2 or 3 cores).
# Each lane's thread takes the GIL a few times a step, and at the engine's 0.2 ms switch interval
# the loop hands it over each time: on H100 hosts (2026-11-26, benchmarks/diag/mask_interference.py)
# 8 lanes slowed the loop's own Python beside the fill by 0.5-1.6 ms a step, 2 lanes by 0.2-0.8, and
# serving with a schema on every request lost 4.7-10.9% of its output with 2 lanes against 7.8-16.9%
# with 8, in the same three calls (BENCHMARKS.md). OSSERVE_MASK_THREADS overrides it (read once at
# import; benchmarks/structured_ab.sh compares settings).
MASK_THREADS = int(os.environ.get("OSSERVE_MASK_THREADS", 0)) or max(1, min(2, (os.cpu_count() or 2) // 2))


# A step's masks on the host: one [rows, words] tensor, or consecutive parts of the rows in separate
# tensors (grammar_process.py: each process fills its own region of the shared buffer).
MaskBits = torch.Tensor | list[torch.Tensor]

STOPPED = b""  # the key of a finished grammar's mask (a free channel's key is its name, never empty)
# A grammar's shared masks at positions inside a JSON answer's value strings (JsonCursor.position_key,
# keys starting with json_cursor.POSITION), at most: 25 KB each, kept with the compiled grammar.
POSITION_MASKS = 16


@dataclass
class GrammarState:
    matcher: LLMatcher
    lane: int  # the mask lane its matchers were copied from (compiling.Compiled.lanes)
    masks: dict[bytes, torch.Tensor]  # its compiling.Compiled's
    free: FreeText | None = None  # where it stands in its free channels (None: the grammar has none)
    failed: str | None = None  # why the grammar cannot go on: the request ends with finish reason "grammar"
    bounded: Bounded | None = None
    key: bytes | None = None  # the shared mask the next token takes (Grammars.next_key), None: llguidance's
    behind: list[int] = field(default_factory=list)  # accepted tokens the matcher has yet to see (accept says when)


@dataclass
class MaskFill:
    """A step's masks under way (Grammars.begin_masks): the rows in buffer order (llguidance's
    first), the buffer, llguidance's rows with their states, the bounded ones among them by slot,
    and the lanes' fills (none: every row took a shared mask)."""

    rows: list[int]
    bits: torch.Tensor
    filled: list[tuple[int, GrammarState]]
    fast: dict[int, Bounded]
    futures: list[Future[list[int]]]  # each lane's: the slots whose fast matcher rejected a token
    elsewhere: bool = False  # filled by another process (grammar_process.py): the fields above are unused
    cleared: dict[int, Bounded] = field(default_factory=dict)  # shared rows of bounded answers, by slot

    @property
    def in_background(self) -> bool:
        """Whether masks are being filled beside the caller (threads, a process) until end_masks."""
        return self.elsewhere or bool(self.futures)


@dataclass
class StepMasks:
    """One step's masks: `rows` (indices into the step's sampled rows, in no particular order) and
    their bits, [len(rows), W] int32 on the host (Grammars': one tensor; MaskBits). `dead` holds the
    rows whose grammar allows no token at all."""

    rows: list[int]
    bits: MaskBits
    dead: list[int]
    waited: float = 0.0  # seconds end_masks waited for llguidance's threads (RemoteGrammars: for its processes)
    # Requests whose grammar rejected a token fed with `accept(..., defer=True)` (grammar_process.py
    # reports them here; Grammars itself reports every rejection from accept).
    rejected: list[str] = field(default_factory=list)
    # RemoteGrammars: of the process whose reply came last, seconds from the step's message to its
    # start on it, and from there to its reply (the loop's wait, split: late to start, or slow).
    process_times: tuple[float, float] | None = None


class Grammars:
    def __init__(self, vocab_size: int, pin_memory: bool = False, shared_masks: bool = True,
                 lanes: int = MASK_THREADS, buffer: torch.Tensor | None = None) -> None:
        """shared_masks: give free-text and finished rows their grammar's shared mask (False: every
        row from llguidance, as a reference). lanes: the mask lanes (the module's docstring).
        buffer: the [rows, words] int32 host buffer the masks are filled into, for good (a step
        never has more rows; grammar_process.py's shared memory), else one grown as steps need."""
        self.words = (vocab_size + 31) // 32
        self.pin_memory = pin_memory
        self.shared_masks = shared_masks
        self.compiler = GrammarCompiler(lanes)
        self._pending: dict[str, tuple[Future[Copies], dict[str, int | None], BoundedAnswer | None]] = {}
        self.states: dict[str, GrammarState] = {}
        self._executors: list[LLExecutor] = []  # a single-threaded llguidance pool a lane (begin_masks makes them)
        self._fillers = ThreadPoolExecutor(lanes, thread_name_prefix="osserve-masks")
        self._fixed = buffer is not None
        self._buffer = buffer if buffer is not None else torch.empty(0, self.words, dtype=torch.int32)
        # The shared mask each buffer row holds, if any.
        self._holds: list[torch.Tensor | None] = [None] * self._buffer.shape[0]

    # ------------------------------------------------------------------ compiling
    def grammar_for(self, spec: StructuredOutputs, max_tokens: int | None) -> Prepared | None:
        """What a request's grammar starts from (None: nothing is constrained): compiling.py's."""
        return self.compiler.grammar_for(spec, max_tokens)

    def start(self, request_id: str, grammar: str, free: dict[str, int | None] | None = None,
              bounded: BoundedAnswer | None = None) -> None:
        """Compile (or copy from the cache) the request's grammar; `ready` hands the result over.
        free: the grammar's free channels and their budgets (grammar.free_channels); bounded: the
        answer's string bounds taken out (grammar.bounded_answer)."""
        self._pending[request_id] = (self.compiler.submit(grammar, bounded), free or {}, bounded)

    def ready(self, wait: bool = False) -> list[tuple[str, str | None]]:
        """The requests whose grammar finished compiling, each with None or the error that stops it
        (a grammar llguidance rejects). wait: block for every pending one (nothing else to do)."""
        done: list[tuple[str, str | None]] = []
        for rid, (future, free, answer) in list(self._pending.items()):
            if not (wait or future.done()):
                continue
            del self._pending[rid]
            try:
                copies = future.result()
            except Exception as e:  # noqa: BLE001 - the library's errors are not typed
                done.append((rid, f"the output grammar could not be built: {e}"))
                continue
            matcher, fast = copies.matcher, copies.fast
            if matcher.is_error():
                done.append((rid, f"the output grammar could not be built: {matcher.get_error()}"))
                continue
            budgets = {name.encode(): budget for name, budget in free.items()}
            bounded = None
            if fast is not None and answer is not None and not fast.is_error():
                # A raw completion's answer is its whole output: the cursor reads from the start.
                bounded = Bounded(fast, answer, None if answer.harmony else JsonCursor(answer.bounds))
            state = GrammarState(matcher, copies.lane, copies.compiled.masks,
                                 FreeText(budgets, utf8_shapes()) if budgets else None, bounded=bounded)
            state.key = self.next_key(state, None)
            self.states[rid] = state
            done.append((rid, None))
        return done

    @staticmethod
    def prepare() -> None:
        GrammarCompiler.prepare()

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def drop(self, request_id: str) -> None:
        pending = self._pending.pop(request_id, None)
        if pending is not None:
            pending[0].cancel()
        self.states.pop(request_id, None)

    # ------------------------------------------------------------------ stepping
    def accept(self, sampled: dict[str, int], defer: bool = False) -> set[str]:
        """Feed each constrained request the token it sampled (once, in order); returns the requests
        whose grammar rejected it. defer: the caller takes rejections later too (from end_masks'
        StepMasks.rejected, where grammar_process.py feeds the tokens); here they come at once."""
        rejected = set()
        states, whole, text = self.states, utf8_shapes().whole, Phase.TEXT
        for rid, token in sampled.items():
            state = states.get(rid)
            if state is None or state.failed is not None or state.key == STOPPED and STOPPED in state.masks:
                continue  # a finished grammar's stop token: its state stays as it is
            free = state.free
            if (free is not None and free.phase is text and not free.owed and whole[token]
                    and free.count + 1 < free.limit and state.key is free.channel and state.key in state.masks):
                # Most rows of a step: free text that took its channel's shared mask and, after this
                # token (whole characters, inside the budget), takes it again. What the general path
                # below does for it, inlined: its calls cost ~1 us a row more (2-core CPU,
                # bench_masks' json at 256 rows: accept 0.77 -> 0.63 ms a step with both fast paths).
                free.count += 1
                state.behind.append(token)
                if state.bounded is not None:
                    state.bounded.feed(token)
                continue
            bounded = state.bounded
            if bounded is not None:
                bounded.feed(token)
                if bounded.done:
                    state.bounded = bounded = None  # the bounded grammar alone from now
                elif bounded.fills:
                    # Inside the answer, where no free channel is: the fast matcher fills the next
                    # mask, or inside a value string its position's shared one does; the matcher
                    # may wait.
                    state.behind.append(token)
                    state.key = bounded.position_key() if self.shared_masks else None
                    continue
            channel = None
            if free is not None and free.phase is not Phase.OFF:
                free.feed(token, token_bytes()[token] if free.in_header else None)
                channel = free.free_channel()
            if channel is not None and channel in state.masks:
                # The next mask is known without the matcher (its channel's shared one): it may wait.
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
        shared: list[tuple[int, torch.Tensor, Bounded | None]] = []  # (row, the grammar's shared mask, a
        # bounded answer's state where the mask is its position's: its overflows are cleared after)
        for row, rid in enumerate(request_ids):
            state = self.states.get(rid)
            if state is None or state.failed is not None:
                continue  # unconstrained (a complete grammar still is: its mask allows the stop tokens only)
            mask = state.masks.get(state.key) if state.key is not None else None
            if mask is None:
                filled.append((row, state))
            else:
                bounded = state.bounded
                shared.append((row, mask, bounded if bounded is not None and bounded.fills else None))
        n = len(filled) + len(shared)
        if not n:
            return None
        if self._buffer.shape[0] < n:
            assert not self._fixed, f"{n} constrained rows in a step, for a buffer of {self._buffer.shape[0]}"
            self._buffer = torch.empty(max(n, 2 * self._buffer.shape[0]), self.words, dtype=torch.int32,
                                       pin_memory=self.pin_memory)
            self._holds = [None] * self._buffer.shape[0]
        bits = self._buffer[:n]
        # A bounded answer's row is filled by its fast matcher, then its cursor clears what overflows.
        fast = {slot: b for slot, (_, state) in enumerate(filled) if (b := state.bounded) is not None and b.fills}
        if filled and not self._executors:  # here, not in the fillers' threads: made once
            from llguidance import LLExecutor

            self._executors = [LLExecutor(1) for _ in range(self.compiler.num_lanes)]
        lanes: dict[int, list[tuple[LLMatcher, int]]] = {}
        feeds: dict[int, list[tuple[LLMatcher, list[int], int]]] = {}  # a lane's fast matchers' tokens, by slot
        for slot, (_, state) in enumerate(filled):
            bounded = fast.get(slot)
            if bounded is None:
                lanes.setdefault(state.lane, []).append((state.matcher, slot))
                continue
            lanes.setdefault(state.lane, []).append((bounded.fast, slot))
            if bounded.pending:  # the lane's thread feeds them first (Bounded: not on the step loop)
                feeds.setdefault(state.lane, []).append((bounded.fast, bounded.pending, slot))
                bounded.pending = []
        futures = [self._fillers.submit(self._fill, lane, matchers, bits, feeds.get(lane, []))
                   for lane, matchers in lanes.items()]
        # llguidance's rows first; then the shared ones, those of one mask together, so that a buffer
        # row mostly holds the same mask as the step before (and is not copied again).
        shared.sort(key=lambda row_mask: id(row_mask[1]))
        holds = self._holds
        cleared: dict[int, Bounded] = {}
        for slot, (_, mask, bounded) in enumerate(shared, len(filled)):
            if holds[slot] is not mask:
                bits[slot].copy_(mask)
                holds[slot] = mask
            if bounded is not None:
                cleared[slot] = bounded
        return MaskFill([row for row, _ in filled] + [row for row, _, _ in shared], bits, filled, fast, futures,
                        cleared=cleared)

    def _fill(self, lane: int, matchers: list[tuple[LLMatcher, int]], bits: torch.Tensor,
              feeds: list[tuple[LLMatcher, list[int], int]]) -> list[int]:
        """One lane's rows, in a thread of the fillers' pool: first the tokens its fast matchers have
        yet to see (one call for the lane's single tokens, which drops the GIL; a whole turn so far,
        once a request, where its answer starts), then the masks (llguidance drops the GIL). Returns
        the slots whose fast matcher rejected a token (end_masks fills them again)."""
        executor = self._executors[lane]
        single = [(matcher, tokens[0]) for matcher, tokens, _ in feeds if len(tokens) == 1]
        accepted = iter(executor.consume_token_par(single) if single else [])
        rejected = [slot for matcher, tokens, slot in feeds
                    if not (next(accepted) if len(tokens) == 1 else matcher.consume_tokens(tokens))]
        # llguidance.torch's fill_next_token_bitmask_par, called as it calls it: importing that
        # module imports torch.compile's machinery (for a function not used here), seconds at the
        # first mask of each process.
        assert bits.dtype == torch.int32 and bits.is_contiguous()
        executor.unsafe_compute_mask_ptr(matchers, bits.data_ptr(), bits.shape[1] * 4, bits.shape[0])
        return rejected

    def end_masks(self, fill: MaskFill) -> StepMasks:
        """Wait for llguidance's rows; clear what overflows a string bound; note the rows whose
        grammar allows nothing, and learn the shared masks met for the first time."""
        waited = 0.0
        rejected: list[int] = []
        if fill.futures:
            start = time.perf_counter()
            for future in fill.futures:
                rejected += future.result()
            waited = time.perf_counter() - start
        bits, filled = fill.bits, fill.filled
        for slot in rejected:
            self._refill(slot, filled[slot][1], fill)
        rows = bits.numpy()  # numpy rows: torch's indexing costs microseconds a row
        # The masks met for the first time at a shared key (a free channel, a position in the answer),
        # copied before any row's overflows are cleared: a position's is the fast matcher's own.
        learnt = {slot: bits[slot].clone() for slot, (_, state) in enumerate(filled) if self._learns(state)}
        runs = vocabulary_runs() if fill.fast or fill.cleared else None
        for slot, bounded in (*fill.fast.items(), *fill.cleared.items()):
            assert runs is not None and bounded.cursor is not None
            runs.clear_overflows(bounded.cursor, rows[slot], bounded.answer.bounds.smallest)
        for slot in fill.cleared:
            self._holds[slot] = None  # it no longer holds the shared mask as it is
        dead = []
        if filled:
            nonempty = _nonempty(rows[: len(filled)])
            for slot, (row, state) in enumerate(filled):
                self._holds[slot] = None
                if state.matcher.is_error() or not nonempty[slot]:
                    state.failed = "the output grammar allows no next token" + (
                        f": {state.matcher.get_error()}" if state.matcher.is_error() else "")
                    dead.append(row)
                elif slot in learnt:  # the grammar's mask there from now on
                    state.masks[state.key] = learnt[slot]  # type: ignore[index]
        return StepMasks(fill.rows, bits, dead, waited)

    @staticmethod
    def _learns(state: GrammarState) -> bool:
        """Whether the mask filled for the state's key is to be kept as that key's shared mask: not
        known yet, and (a position's) within POSITION_MASKS of its grammar."""
        key = state.key
        if key is None or key in state.masks:
            return False
        return not key.startswith(POSITION) or sum(k.startswith(POSITION) for k in state.masks) < POSITION_MASKS

    def _refill(self, slot: int, state: GrammarState, fill: MaskFill) -> None:
        """A row whose fast matcher rejected a token (its grammar, without the string bounds, takes
        more than the bounded one, so it should not): the request goes on with the bounded grammar
        alone, which is fed what it has yet to see and fills the row (an error there ends it)."""
        state.bounded = None
        state.key = None  # not the fast matcher's position any more: nothing to learn
        fill.fast.pop(slot)
        behind, state.behind = state.behind, []
        if not behind or state.matcher.consume_tokens(behind):
            row = fill.bits[slot]  # as llguidance.torch's fill_next_token_bitmask (_fill says why not it)
            state.matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())

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
