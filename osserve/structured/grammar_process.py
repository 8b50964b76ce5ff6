"""The engine's grammars in a process of their own: RemoteGrammars, which the engine holds on a GPU
in place of matchers.Grammars, runs one in a child process and talks to it over a socket pair.

Why: serving with a JSON schema on every request is bound by the engine's step loop on most hosts.
On an H100 host (2026-11-27, py-spy of the loop, 256 streams) the loop waited for the GPU 37% of
the time without schemas and 4% with them; the grammars' own work (feeding 256 matchers their
tokens, the masks' bookkeeping) took ~21% of it, and the mask threads' GIL hand-overs slowed the
rest. Here that Python runs beside the loop, under a GIL of its own, and the loop is left a
message a step and the wait for its reply.

What the child does is matchers.Grammars' work, unchanged: the same matchers, lanes and shared
masks, filled into a buffer in shared memory that the engine uploads from (page-locked for the
GPU's copy where CUDA is there). Requests go down in order and the child answers only those that
wait: "start", "drop" and a deferred "accept" do not.

One thing moves later. In the step loop the step before's tokens are fed to the matchers right
before this step's masks are asked for (engine.py); here both go down in one message
(`accept(..., defer=True)`, then begin_masks), so that the loop turns the step before's tokens into
deltas while the child works. A token a grammar rejects (none should: it was drawn from that
grammar's mask) is then known with the masks, after its delta went out, and its request ends with
finish reason "grammar" at this step instead of the step before (StepMasks.rejected). A
speculative step's accept still waits (its drafts can be rejected).

The child is `python -m osserve.structured.grammar_process FD` (subprocess, as the tensor-parallel
ranks are: the engine may run in a daemonic process, which multiprocessing forbids children). It
exits with its parent. If it dies, every call raises GrammarProcessError.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
import traceback
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from multiprocessing.util import Finalize
from pathlib import Path
from typing import Any

import torch

from osserve.structured.compiling import GrammarCompiler, Prepared
from osserve.structured.grammar import BoundedAnswer
from osserve.structured.matchers import MASK_THREADS, Grammars, MaskFill, StepMasks
from osserve.structured.spec import StructuredOutputs

log = logging.getLogger("osserve")

ENV = "OSSERVE_GRAMMAR_PROCESS"  # "1": in a process of their own, "0": in the engine's (default: on a GPU)


def in_own_process(cuda: bool) -> bool:
    """Whether an engine's grammars run in a process of their own: on a GPU, unless OSSERVE_GRAMMAR_PROCESS
    says otherwise (a CPU engine's loop waits for its model, not its host work)."""
    setting = os.environ.get(ENV, "")
    return setting == "1" if setting in ("0", "1") else cuda


class GrammarProcessError(RuntimeError):
    """The grammars' process died or failed: no constrained request can go on."""


class RemoteGrammars:
    """matchers.Grammars' interface for the engine (engine.py, speculative_step.py, warm_up.py),
    served by a child process. `states` holds the requests whose grammar is ready, until dropped."""

    def __init__(self, vocab_size: int, max_rows: int, pin_memory: bool = False, lanes: int = MASK_THREADS) -> None:
        self.words = (vocab_size + 31) // 32
        self.compiler = GrammarCompiler(lanes)  # grammar_for's cache and the lane count: it compiles nothing here
        self._shm = SharedMemory(create=True, size=max_rows * self.words * 4)
        self.bits = torch.frombuffer(self._shm.buf, dtype=torch.int32).view(max_rows, self.words)
        locked = pin_memory and _page_lock(self.bits)
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        package_root = str(Path(__file__).resolve().parents[2])  # the child imports osserve from here too
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        self._proc = subprocess.Popen([sys.executable, "-m", "osserve.structured.grammar_process",
                                       str(theirs.fileno())], pass_fds=(theirs.fileno(),), env=env)
        theirs.close()
        self._conn = Connection(ours.detach())
        self._conn.send((vocab_size, max_rows, lanes, self._shm.name))
        self.states: set[str] = set()
        self._pending: set[str] = set()
        self._failures: dict[str, str] = {}
        self._queued: dict[str, int] = {}  # deferred tokens, sent with the next message that waits
        self._finalize = Finalize(self, _stop, args=(self._conn, self._proc, self._shm,
                                                     self.bits.data_ptr() if locked else None), exitpriority=10)

    # ------------------------------------------------------------------ compiling
    def grammar_for(self, spec: StructuredOutputs, max_tokens: int | None) -> Prepared | None:
        return self.compiler.grammar_for(spec, max_tokens)

    def start(self, request_id: str, grammar: str, free: dict[str, int | None] | None = None,
              bounded: BoundedAnswer | None = None) -> None:
        self._pending.add(request_id)
        self._send(("start", request_id, grammar, free, bounded))

    def ready(self, wait: bool = False) -> list[tuple[str, str | None]]:
        done: list[tuple[str, str | None]] = self._call(("ready", wait))[1]
        for rid, error in done:
            self._pending.discard(rid)
            if error is None:
                self.states.add(rid)
        return done

    def prepare(self) -> None:
        self._call(("prepare",))

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def drop(self, request_id: str) -> None:
        self._pending.discard(request_id)
        self.states.discard(request_id)
        self._failures.pop(request_id, None)
        self._queued.pop(request_id, None)
        self._send(("drop", request_id))

    # ------------------------------------------------------------------ stepping
    def accept(self, sampled: dict[str, int], defer: bool = False) -> set[str]:
        """defer: the tokens go down with the next masks (module docstring); their rejections come
        back in that StepMasks. Else fed now (with any deferred before them), rejections returned."""
        self._queued.update(sampled)
        if defer:
            return set()
        _, rejected, failures = self._call(("accept", self._take_queued()))
        self._failures.update(failures)
        return set(rejected)

    def begin_masks(self, request_ids: list[str]) -> MaskFill | None:
        if not any(rid in self.states and rid not in self._failures for rid in request_ids):
            if self._queued:
                self._send(("feed", self._take_queued()))
            return None
        self._send(("step", self._take_queued(), request_ids))
        return MaskFill([], self.bits, [], {}, [], elsewhere=True)

    def end_masks(self, fill: MaskFill) -> StepMasks:
        _, rejected, failures, rows, dead, waited = self._receive()
        self._failures.update(failures)
        return StepMasks(rows, self.bits[:len(rows)], dead, waited, rejected)

    def masks(self, request_ids: list[str]) -> StepMasks | None:
        fill = self.begin_masks(request_ids)
        return self.end_masks(fill) if fill is not None else None

    def failure(self, request_id: str) -> str | None:
        return self._failures.get(request_id)

    # ------------------------------------------------------------------ the child
    def _take_queued(self) -> dict[str, int]:
        queued, self._queued = self._queued, {}
        return queued

    def _send(self, msg: tuple[Any, ...]) -> None:
        try:
            self._conn.send(msg)
        except OSError as e:
            raise GrammarProcessError(f"the grammars' process is gone ({e})") from e

    def _receive(self) -> tuple[Any, ...]:
        """The child's next reply, however long it takes (a large grammar compiles for seconds), as
        long as the child lives."""
        try:
            while not self._conn.poll(1.0):
                if self._proc.poll() is not None:
                    raise GrammarProcessError(f"the grammars' process exited with code {self._proc.returncode}")
            reply: tuple[Any, ...] = self._conn.recv()
        except (EOFError, OSError) as e:
            raise GrammarProcessError(f"the grammars' process is gone ({e!r})") from e
        if reply[0] == "error":
            raise GrammarProcessError(f"the grammars' process failed:\n{reply[1]}")
        return reply

    def _call(self, msg: tuple[Any, ...]) -> tuple[Any, ...]:
        self._send(msg)
        return self._receive()


def _page_lock(bits: torch.Tensor) -> bool:
    """Page-lock the shared buffer for the GPU's asynchronous copy; where CUDA refuses, the copy
    is a synchronous one from pageable memory (correct, slower)."""
    err = torch.cuda.cudart().cudaHostRegister(bits.data_ptr(), bits.numel() * bits.element_size(), 0)
    if int(err) != 0:
        log.warning("grammars: the shared mask buffer could not be page-locked (CUDA error %s)", int(err))
        return False
    return True


def _stop(conn: Connection, proc: subprocess.Popen[bytes], shm: SharedMemory, locked: int | None) -> None:
    try:
        conn.send(("stop",))
    except OSError:
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if locked is not None:
        torch.cuda.cudart().cudaHostUnregister(locked)
    try:
        shm.close()
    except BufferError:  # a view of it still lives (a StepMasks held somewhere): the process ends soon
        pass
    shm.unlink()


# ---------------------------------------------------------------------- the child's side
def serve(conn: Connection, grammars: Grammars) -> None:
    """Answer the engine's requests in order until it says stop or goes away. Rejections of tokens
    fed without a reply ("feed") are reported with the next masks or accept."""
    rejected: set[str] = set()

    def failures(rids: set[str]) -> dict[str, str]:
        return {rid: why for rid in rids if (why := grammars.failure(rid)) is not None}

    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        kind = msg[0]
        if kind == "start":
            grammars.start(*msg[1:])
        elif kind == "drop":
            grammars.drop(msg[1])
            rejected.discard(msg[1])
        elif kind == "feed":
            rejected |= grammars.accept(msg[1])
        elif kind == "accept":
            rejected |= grammars.accept(msg[1])
            conn.send(("accepted", sorted(rejected), failures(rejected)))
            rejected = set()
        elif kind == "step":
            _, tokens, request_ids = msg
            rejected |= grammars.accept(tokens)
            fill = grammars.begin_masks(request_ids)
            masks = grammars.end_masks(fill) if fill is not None else None
            rows, dead, waited = (masks.rows, masks.dead, masks.waited) if masks is not None else ([], [], 0.0)
            failed = rejected | {request_ids[i] for i in dead}
            conn.send(("masks", sorted(rejected), failures(failed), rows, dead, waited))
            rejected = set()
        elif kind == "ready":
            conn.send(("ready", grammars.ready(wait=msg[1])))
        elif kind == "prepare":
            grammars.prepare()
            conn.send(("prepared",))
        elif kind == "stop":
            return


def main(argv: list[str]) -> int:
    conn = Connection(int(argv[0]))
    vocab_size, max_rows, lanes, shm_name = conn.recv()
    shm = SharedMemory(name=shm_name)
    # The engine's process made it and unlinks it: this one's tracker must not (Python < 3.13).
    resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    words = (vocab_size + 31) // 32
    bits = torch.frombuffer(shm.buf, dtype=torch.int32).view(max_rows, words)
    _exit_with_parent()
    try:
        serve(conn, Grammars(vocab_size, lanes=lanes, buffer=bits))
    except Exception:  # noqa: BLE001 - said to the engine, whatever it is
        try:
            conn.send(("error", traceback.format_exc()))
        except OSError:
            pass
        return 1
    return 0


def _exit_with_parent() -> None:
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="osserve-grammar-parent-watch", daemon=True).start()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
