"""Whether a load slows other Python on the host: a fixed stretch of pure Python (the engine loop's
kind of work: attribute reads, dicts and lists over 256 request-like objects) run over and over on
one CPU, timed by the wall clock and by the thread's own CPU clock, until SIGINT or SIGTERM; then
one line: the stretch's median and p90 ms both ways, and how many stretches ran.

The wall time grows when the CPU is shared (other threads scheduled on it); the CPU time grows
when the same instructions run slower (caches or memory shared with busier neighbours, a lower
clock when more cores are busy). Run beside a plain round and a json round of one server
(structured_ab.sh's PROBE_CPU): if the json round slows the probe as it slows the engine's loop
(whose schedule and build+launch take longer in json windows even on cores of their own), the
cause is the host's shared resources, not the loop's own code.

    taskset -c 15 python3 benchmarks/diag/host_probe.py & ... the load ...; kill -INT $!
"""

from __future__ import annotations

import signal
import statistics
import sys
import time
from dataclasses import dataclass, field


@dataclass
class FakeRequest:
    request_id: str
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: str = "running"


def stretch(requests: list[FakeRequest], table: dict[str, int]) -> int:
    """One stretch: a few passes over the requests, as scheduling and turning tokens into deltas do."""
    total = 0
    for step in range(8):
        rows = {}
        for i, r in enumerate(requests):
            if r.status == "running":
                rows[r.request_id] = i
                r.output_token_ids.append((i * 31 + step) % 201088)
                r.num_computed_tokens += 1
        for rid, i in rows.items():
            total += table[rid] + i
        for r in requests:  # keep the lists short, so the working set stays the same
            if len(r.output_token_ids) > 256:
                del r.output_token_ids[:128]
    return total


def main() -> int:
    requests = [FakeRequest(f"chatcmpl-{i:032x}") for i in range(256)]
    table = {r.request_id: i for i, r in enumerate(requests)}
    walls: list[float] = []
    cpus: list[float] = []
    stop = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    while not stop:
        wall, cpu = time.perf_counter(), time.thread_time()
        stretch(requests, table)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.thread_time() - cpu)
    if not walls:
        return 1

    def ms(xs: list[float], q: float) -> float:
        return 1e3 * sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]

    print(f"probe: {len(walls)} stretches; wall ms p50 {1e3 * statistics.median(walls):.3f} p90 {ms(walls, 0.9):.3f};"
          f" cpu ms p50 {1e3 * statistics.median(cpus):.3f} p90 {ms(cpus, 0.9):.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
