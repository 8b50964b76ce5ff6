"""A grammar process (grammar_process.py starts it): matchers.Grammars serving one engine's
requests over a socket pair, the masks filled into its region of the engine's shared buffer.

    python -m osserve.structured.grammar_child FD   (FD: its end of the socket pair)

The engine sends (vocab_size, max_rows, lanes, shared memory name, index) first, then requests in
order; this process answers those that wait ("accept", "step", "ready", "prepare") in the same
order. It ignores Ctrl-C (the engine stops it) and exits when the engine goes away.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory

import torch

from osserve.child_process import become_engine_child
from osserve.structured.matchers import Grammars

# This process's GIL switch interval, as the engine process's (process_engine.py): its main thread
# accepts tokens and copies shared masks in Python while the mask lanes' threads wait to start
# llguidance's fills; at Python's default 5 ms they waited for the main thread to block.
# OSSERVE_GRAMMAR_SWITCH_INTERVAL_S overrides it (benchmarks/diag/grammar_loop.py compares).
SWITCH_INTERVAL_S = float(os.environ.get("OSSERVE_GRAMMAR_SWITCH_INTERVAL_S", 0.0002))


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
        received = time.perf_counter()  # the same clock as the engine's (CLOCK_MONOTONIC): its log compares them
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
            rows, dead = (masks.rows, masks.dead) if masks is not None else ([], [])
            failed = rejected | {request_ids[i] for i in dead}
            conn.send(("masks", sorted(rejected), failures(failed), rows, dead, (received, time.perf_counter())))
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
    vocab_size, max_rows, lanes, shm_name, index = conn.recv()
    try:
        shm = SharedMemory(name=shm_name)
    except FileNotFoundError:  # the engine stopped while this process was starting: nothing to serve
        return 0
    # The engine's process made it and unlinks it: this one's tracker must not (Python < 3.13).
    resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    words = (vocab_size + 31) // 32
    bits = torch.frombuffer(shm.buf, dtype=torch.int32).view(-1, max_rows, words)[index]
    become_engine_child("osserve-grammar-parent-watch")
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        serve(conn, Grammars(vocab_size, lanes=lanes, buffer=bits))
    except Exception:  # noqa: BLE001 - said to the engine, whatever it is
        try:
            conn.send(("error", traceback.format_exc()))
        except OSError:
            pass
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
