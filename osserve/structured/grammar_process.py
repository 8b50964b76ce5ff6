"""The engine's grammars in processes of their own: RemoteGrammars, which the engine holds on a GPU
in place of matchers.Grammars, runs one in each of SHARDS child processes, deals the requests out
among them in turn, and talks to each over a socket pair.

Why: serving with a JSON schema on every request is bound by the engine's step loop on most hosts.
On an H100 host (2026-11-27, py-spy of the loop, 256 streams) the loop waited for the GPU 37% of
the time without schemas and 4% with them; the grammars' own work (feeding 256 matchers their
tokens, the masks' bookkeeping) took ~21% of it, and the mask threads' GIL hand-overs slowed the
rest. Here that Python runs beside the loop, under GILs of their own, and the loop is left a
message a step to each process and the wait for their replies.

What a child does is matchers.Grammars' work for its requests, unchanged: the same matchers, lanes
and shared masks, filled into its region of a buffer in shared memory that the engine uploads from
(page-locked for the GPU's copy where CUDA is there; the regions are the parts of a MaskBits).
Requests go down in order and a child answers only those that wait: "start", "drop" and a deferred
"accept" do not.

One thing moves later. In the step loop the step before's tokens are fed to the matchers right
before this step's masks are asked for (engine.py); here both go down in one message
(`accept(..., defer=True)`, then begin_masks), so that the loop turns the step before's tokens into
deltas while the child works. A token a grammar rejects (none should: it was drawn from that
grammar's mask) is then known with the masks, after its delta went out, and its request ends with
finish reason "grammar" at this step instead of the step before (StepMasks.rejected). A
speculative step's accept still waits (its drafts can be rejected).

A child is `python -m osserve.structured.grammar_child FD` (grammar_child.py; subprocess, as the
tensor-parallel ranks are: the engine may run in a daemonic process, which multiprocessing forbids
children). It exits with its parent. One that dies is replaced, and only its requests end
(RemoteGrammars).
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from multiprocessing.util import Finalize
from pathlib import Path
from typing import Any

import torch

from osserve.structured.compiling import GrammarCompiler, Prepared
from osserve.structured.grammar import BoundedAnswer
from osserve.structured.matchers import MASK_THREADS, MaskFill, StepMasks
from osserve.structured.spec import StructuredOutputs

log = logging.getLogger("osserve")

ENV = "OSSERVE_GRAMMAR_PROCESS"  # "1": in a process of their own, "0": in the engine's (default: on a GPU)
# Grammar processes, the requests dealt out among them in turn. One process's work a step (feeding
# the step before's tokens, then the masks) took ~3.5 ms at 256 JSON rows on an H100 host
# (2026-11-27, benchmarks/diag/grammar_loop.py), longer than the loop's own work it hides behind
# (turning the step before's tokens into deltas, ~1.5 ms), and it is mostly Python under one GIL:
# more lanes did not shorten it (8 lanes: longer), more processes do. Serving at c=256 with a
# schema on every request (H100s, 2026-11-27, three calls on two machines, 2 and 4 in each; the
# `engine:` log's windows of 240-250 requests), the last process to reply worked 2.3-2.8 ms a step
# with 2 and 1.5-2.0 with 4, and the loop waited 1.3-1.6 ms for them against 0.5-0.8. Json against
# plain: median −8.7% (−5.0% to −13.1%) with 2, −5.6% (−2.0% to −9.6%, once −18.4%) with 4
# (BENCHMARKS.md, "Structured outputs"). So 4, one for each 4 cores (1 on a host of under 8).
# OSSERVE_GRAMMAR_SHARDS overrides.
SHARDS = int(os.environ.get("OSSERVE_GRAMMAR_SHARDS", 0)) or max(1, min(4, (os.cpu_count() or 2) // 4))


def in_own_process(cuda: bool) -> bool:
    """Whether an engine's grammars run in a process of their own: on a GPU, unless OSSERVE_GRAMMAR_PROCESS
    says otherwise (a CPU engine's loop waits for its model, not its host work)."""
    setting = os.environ.get(ENV, "")
    return setting == "1" if setting in ("0", "1") else cuda


class GrammarProcessError(RuntimeError):
    """The grammars' processes kept dying (RemoteGrammars.MAX_DEATHS): no constrained request can go on."""


@dataclass(eq=False)  # a child is itself alone (hashed by identity)
class _Child:
    """One grammar process: its end of the socket pair, and its region of the shared mask buffer."""

    index: int
    conn: Connection
    proc: subprocess.Popen[bytes]
    bits: torch.Tensor  # [max_rows, words]: the rows it fills
    queued: dict[str, int] = field(default_factory=dict)  # deferred tokens, sent with its next message that waits
    stepping: bool = False  # asked for a step's masks, not yet received
    sent: float = 0.0  # when it was last asked for masks (perf_counter: the children's clock too)


class _Lost(Exception):
    """A child died (RemoteGrammars._lose has replaced it)."""


class RemoteGrammars:
    """matchers.Grammars' interface for the engine (engine.py, speculative_step.py, warm_up.py),
    served by `shards` child processes, each with the requests started n-th for n = its index mod
    shards. `states` holds the requests whose grammar is ready, until dropped.

    A child that dies is replaced by a new process; its requests end with finish reason "grammar"
    (reported as rejected by the next masks or accept, or as failed by ready), the others go on.
    More than MAX_DEATHS deaths within DEATHS_WINDOW_S raise GrammarProcessError (something kills
    them all: the engine stops with that error rather than spawn processes forever)."""

    MAX_DEATHS = 3
    DEATHS_WINDOW_S = 60.0

    def __init__(self, vocab_size: int, max_rows: int, pin_memory: bool = False, lanes: int = MASK_THREADS,
                 shards: int | None = None) -> None:
        shards = shards or SHARDS
        self.words = (vocab_size + 31) // 32
        # grammar_for's cache; num_lanes is what the warm-up compiles: every lane of every shard
        self.compiler = GrammarCompiler(lanes * shards)
        self._shm = SharedMemory(create=True, size=shards * max_rows * self.words * 4)
        self._buffer = torch.frombuffer(self._shm.buf, dtype=torch.int32).view(shards, max_rows, self.words)
        locked = pin_memory and _page_lock(self._buffer)
        self._env = dict(os.environ)
        package_root = str(Path(__file__).resolve().parents[2])  # the children import osserve from here too
        self._env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, self._env.get("PYTHONPATH")) if p)
        self._setup = (vocab_size, max_rows, lanes, self._shm.name)
        self._children = [self._spawn(i) for i in range(shards)]
        self.states: set[str] = set()
        self._shard: dict[str, _Child] = {}  # a started request's child
        self._started = 0
        self._pending: set[str] = set()
        self._failures: dict[str, str] = {}
        self._lost: set[str] = set()  # ready requests of a dead child, not yet reported as rejected
        self._lost_pending: list[tuple[str, str]] = []  # pending ones, not yet reported by ready
        self._deaths: list[float] = []  # when children died (monotonic), within DEATHS_WINDOW_S
        self._finalize = Finalize(self, _stop, args=(self._children, self._shm,
                                                     self._buffer.data_ptr() if locked else None), exitpriority=10)

    def _spawn(self, index: int) -> _Child:
        ours, theirs = socket.socketpair()
        proc = subprocess.Popen([sys.executable, "-m", "osserve.structured.grammar_child", str(theirs.fileno())],
                                pass_fds=(theirs.fileno(),), env=self._env)
        theirs.close()
        conn = Connection(ours.detach())
        conn.send((*self._setup, index))
        return _Child(index, conn, proc, self._buffer[index])

    def _lose(self, child: _Child, why: str) -> None:
        """Replace a dead child by a new process; its requests end (module docstring)."""
        now = time.monotonic()
        self._deaths = [t for t in self._deaths if now - t < self.DEATHS_WINDOW_S] + [now]
        log.error("grammars: process %d died (%s); its requests end with finish reason \"grammar\"", child.index, why)
        if len(self._deaths) > self.MAX_DEATHS:
            raise GrammarProcessError(f"the grammars' processes died {len(self._deaths)} times in "
                                      f"{self.DEATHS_WINDOW_S:g} s, the last: {why}")
        reason = f"the grammar process serving it died ({why})"
        for rid in [rid for rid, c in self._shard.items() if c is child]:
            del self._shard[rid]
            if rid in self._pending:
                self._pending.discard(rid)
                self._lost_pending.append((rid, reason))
            elif rid in self.states and rid not in self._failures:
                self._failures[rid] = reason
                self._lost.add(rid)
        child.proc.kill()
        child.proc.wait()
        child.conn.close()
        self._children[child.index] = self._spawn(child.index)

    # ------------------------------------------------------------------ compiling
    def grammar_for(self, spec: StructuredOutputs, max_tokens: int | None) -> Prepared | None:
        return self.compiler.grammar_for(spec, max_tokens)

    def start(self, request_id: str, grammar: str, free: dict[str, int | None] | None = None,
              bounded: BoundedAnswer | None = None) -> None:
        index = self._started % len(self._children)
        self._started += 1
        self._pending.add(request_id)
        for _ in range(2):  # a child found dead here is replaced: the new one takes it
            child = self._children[index]
            self._shard[request_id] = child
            try:
                return self._send(child, ("start", request_id, grammar, free, bounded))
            except _Lost:
                self._pending.add(request_id)
                self._lost_pending = [(rid, why) for rid, why in self._lost_pending if rid != request_id]

    def ready(self, wait: bool = False) -> list[tuple[str, str | None]]:
        """Asks each child with pending grammars (a round trip: after the starts sent before it, so
        that a grammar copied at once in its process is ready at once, as in Grammars); with the
        pending requests of children that died, failed."""
        asked = [c for c in self._children if any(self._shard.get(rid) is c for rid in self._pending)]
        for child in list(asked):
            try:
                self._send(child, ("ready", wait))
            except _Lost:
                asked.remove(child)
        done: list[tuple[str, str | None]] = []
        for child in asked:
            try:
                done += self._receive(child)[1]
            except _Lost:
                pass
        for rid, error in done:
            self._pending.discard(rid)
            if error is None:
                self.states.add(rid)
        done += self._lost_pending
        self._lost_pending = []
        return done

    def prepare(self) -> None:
        for child in list(self._children):
            try:
                self._send(child, ("prepare",))
                self._receive(child)
            except _Lost:
                pass

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def drop(self, request_id: str) -> None:
        self._pending.discard(request_id)
        self.states.discard(request_id)
        self._failures.pop(request_id, None)
        self._lost.discard(request_id)
        child = self._shard.pop(request_id, None)
        if child is not None:
            child.queued.pop(request_id, None)
            try:
                self._send(child, ("drop", request_id))
            except _Lost:
                pass

    # ------------------------------------------------------------------ stepping
    def accept(self, sampled: dict[str, int], defer: bool = False) -> set[str]:
        """defer: the tokens go down with the next masks (module docstring); their rejections come
        back in that StepMasks. Else fed now (with any deferred before them), rejections returned."""
        for rid, token in sampled.items():
            child = self._shard.get(rid)
            if child is not None:
                child.queued[rid] = token
        if defer:
            return set()
        asked = [c for c in self._children if c.queued]
        for child in list(asked):
            try:
                self._send(child, ("accept", _take_queued(child)))
            except _Lost:
                asked.remove(child)
        rejected: set[str] = set()
        for child in asked:
            try:
                _, child_rejected, failures = self._receive(child)
            except _Lost:
                continue
            self._failures.update(failures)
            rejected.update(child_rejected)
        rejected |= self._lost
        self._lost = set()
        return rejected

    def begin_masks(self, request_ids: list[str]) -> MaskFill | None:
        """Each child with a constrained row in the step fills its masks (and is fed its deferred
        tokens first); the others are fed theirs."""
        stepping = {self._shard[rid] for rid in request_ids if rid in self.states and rid not in self._failures}
        for child in list(self._children):
            try:
                if child in stepping:
                    child.stepping = True
                    child.sent = time.perf_counter()
                    self._send(child, ("step", _take_queued(child), request_ids))
                elif child.queued:
                    self._send(child, ("feed", _take_queued(child)))
            except _Lost:
                pass
        if not stepping and not self._lost:
            return None
        return MaskFill([], self._children[0].bits, [], {}, [], elsewhere=True)

    def end_masks(self, fill: MaskFill) -> StepMasks:
        """The children's rows one after another: their bits are separate regions of the buffer.
        `waited` is the time spent here, waiting for the children's replies; `process_times` the
        last reply's child's (start, work). Requests of a child that died come back rejected."""
        start = time.perf_counter()
        rows: list[int] = []
        parts: list[torch.Tensor] = []
        dead: list[int] = []
        rejected: list[str] = []
        last_reply, times = 0.0, (0.0, 0.0)
        for child in list(self._children):
            if not child.stepping:
                continue
            child.stepping = False
            try:
                _, child_rejected, failures, child_rows, child_dead, (received, replied) = self._receive(child)
            except _Lost:
                continue
            if replied > last_reply:
                last_reply, times = replied, (received - child.sent, replied - received)
            self._failures.update(failures)
            rejected += child_rejected
            if child_rows:
                rows += child_rows
                parts.append(child.bits[:len(child_rows)])
            dead += child_dead
        rejected += sorted(self._lost)
        self._lost = set()
        bits = parts[0] if len(parts) == 1 else parts
        return StepMasks(rows, bits, dead, time.perf_counter() - start, rejected, times)

    def masks(self, request_ids: list[str]) -> StepMasks | None:
        fill = self.begin_masks(request_ids)
        return self.end_masks(fill) if fill is not None else None

    def failure(self, request_id: str) -> str | None:
        return self._failures.get(request_id)

    # ------------------------------------------------------------------ the children
    def _send(self, child: _Child, msg: tuple[Any, ...]) -> None:
        try:
            child.conn.send(msg)
        except OSError as e:
            self._lose(child, repr(e))
            raise _Lost from e

    def _receive(self, child: _Child) -> tuple[Any, ...]:
        """The child's next reply, however long it takes (a large grammar compiles for seconds), as
        long as the child lives. A reply "error" (its loop failed) is a death too."""
        try:
            while not child.conn.poll(1.0):
                if child.proc.poll() is not None:
                    raise EOFError(f"exited with code {child.proc.returncode}")
            reply: tuple[Any, ...] = child.conn.recv()
        except (EOFError, OSError) as e:
            self._lose(child, str(e) or repr(e))
            raise _Lost from e
        if reply[0] == "error":
            self._lose(child, reply[1].strip().splitlines()[-1])
            log.error("grammars: process %d failed:\n%s", child.index, reply[1])
            raise _Lost
        return reply


def _take_queued(child: _Child) -> dict[str, int]:
    queued, child.queued = child.queued, {}
    return queued


def _page_lock(bits: torch.Tensor) -> bool:
    """Page-lock the shared buffer for the GPU's asynchronous copy; where CUDA refuses, the copy
    is a synchronous one from pageable memory (correct, slower)."""
    err = torch.cuda.cudart().cudaHostRegister(bits.data_ptr(), bits.numel() * bits.element_size(), 0)
    if int(err) != 0:
        log.warning("grammars: the shared mask buffer could not be page-locked (CUDA error %s)", int(err))
        return False
    return True


def _stop(children: list[_Child], shm: SharedMemory, locked: int | None) -> None:
    for child in children:
        try:
            child.conn.send(("stop",))
        except OSError:
            pass
    for child in children:
        try:
            child.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            child.proc.kill()
            child.proc.wait()
    if locked is not None:
        torch.cuda.cudart().cudaHostUnregister(locked)
    try:
        shm.close()
    except BufferError:  # a view of it still lives (a StepMasks held somewhere): the process ends soon
        pass
    shm.unlink()
