"""How much of each server process's time the garbage collector takes: in every Python process
started with this folder on PYTHONPATH (the supervisor, the engine, the HTTP servers, the grammar
processes), gc.callbacks time each collection, and a daemon thread logs a line to stderr every
OSSERVE_GC_LOG_S seconds (default 2) while collections happened: the process's name, collections by
generation, their total and longest ms over the interval. A json round against a plain one on one
server tells whether the engine's loop pays for the collector where it did not before (the engine
freezes what it built at start; what a step allocates and keeps is collected as it goes):

    DIAG_PATH=$PWD/benchmarks/diag/gc_time SKIP_ENGINE=1 RUNS="plain json" bash benchmarks/structured_ab.sh

The engine process is named `osserve-engine` (multiprocessing's name; structured_ab.sh prints its
lines per round); a grammar process shows as `grammar_child`. OSSERVE_GC_THRESHOLD="A,B,C" sets
gc.set_threshold(A, B, C) in every such process (Python 3.12's default: 700, 10, 10), to try
other thresholds against the default on one machine.
"""

import gc
import os
import sys
import threading
import time

INTERVAL_S = float(os.environ.get("OSSERVE_GC_LOG_S", 2.0))


class _Collections:
    """Collections since the last line: counts by generation, total and longest seconds."""

    def __init__(self) -> None:
        self.started = 0.0
        self.counts = [0, 0, 0]
        self.total = 0.0
        self.longest = 0.0

    def callback(self, phase: str, info: dict) -> None:
        now = time.perf_counter()
        if phase == "start":
            self.started = now
            return
        spent = now - self.started
        self.counts[info["generation"]] += 1
        self.total += spent
        self.longest = max(self.longest, spent)

    def take(self) -> tuple[list[int], float, float]:
        taken = (self.counts, self.total, self.longest)
        self.counts, self.total, self.longest = [0, 0, 0], 0.0, 0.0
        return taken


def _name() -> str:
    import multiprocessing

    name = multiprocessing.current_process().name
    if name != "MainProcess":
        return name
    args = " ".join(sys.argv)
    return "grammar_child" if "grammar_child" in args else os.path.basename(sys.argv[0] or "python")


def _report(collections: _Collections) -> None:
    while True:
        time.sleep(INTERVAL_S)
        counts, total, longest = collections.take()  # a collection that ends meanwhile lands in the next
        if sum(counts):
            print(f"gc: {_name()} pid {os.getpid()} {time.time():.1f}: collections {counts[0]}/{counts[1]}/{counts[2]}"
                  f" (gen 0/1/2), {1e3 * total:.1f} ms in {INTERVAL_S:g} s, longest {1e3 * longest:.2f} ms",
                  file=sys.stderr, flush=True)


if threshold := os.environ.get("OSSERVE_GC_THRESHOLD"):
    gc.set_threshold(*(int(x) for x in threshold.split(",")))
_collections = _Collections()
gc.callbacks.append(_collections.callback)
threading.Thread(target=_report, args=(_collections,), name="gc-time-log", daemon=True).start()
