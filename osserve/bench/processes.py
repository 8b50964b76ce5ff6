"""The load spread over several processes, each with its own event loop and httpx client.

One Python process parses a few tens of thousands of SSE events per second at most (httpx, h11,
anyio per chunk). At 256 streams osserve sends ~13k events/s, and on the H100 host the single
load generator sat at 90-100% of a core: its own lag was being measured as the server's TTFT and
ITL. So `--workers N` runs N processes; worker w sends requests w, w+N, w+2N, ... with its share
of the concurrency (and of --request-rate: the sum of N Poisson streams is one Poisson stream).
Every worker counts its times from the parent's start (time.perf_counter is the system's
monotonic clock on Linux and macOS, shared by processes) and reports each request as it finishes
(the parent's progress bar), then its records when it ends: the parent's records, in submission
order, are what one process's would be.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing as mp
import os
import queue
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

from osserve.bench.loadgen import LoadConfig, make_prompts, run_load
from osserve.bench.stats import RequestRecord

STREAMS_PER_WORKER = 64  # --workers auto: one process per this many concurrent streams


def auto_workers(concurrency: int) -> int:
    return max(1, min(math.ceil(concurrency / STREAMS_PER_WORKER), (os.cpu_count() or 1) // 2))


def shares(cfg: LoadConfig, workers: int) -> list[tuple[LoadConfig, list[int]]]:
    """(worker's config, the request indices it sends) for each worker that gets any request."""
    out = []
    for w in range(min(workers, cfg.num_requests, cfg.concurrency)):
        indices = list(range(w, cfg.num_requests, workers))
        concurrency = cfg.concurrency // workers + (w < cfg.concurrency % workers)
        rate = cfg.request_rate / workers if cfg.request_rate else None
        out.append((replace(cfg, num_requests=len(indices), concurrency=concurrency, request_rate=rate,
                            seed=cfg.seed + w), indices))
    return out


def _worker(cfg: LoadConfig, indices: list[int], prompts: list[str], go: Any, start: Any, results: Any) -> None:
    # Ctrl-C reaches the parent, which passes it on as SIGINT once run_load listens for it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def ready_then_start() -> float:  # called by run_load once its client is made
        results.put(("ready", None))
        go.wait()
        return float(start.value)

    records, _ = asyncio.run(run_load(cfg, lambda _: results.put(("done", None)), prompts, ready_then_start))
    results.put(("records", (indices, [asdict(r) for r in records])))


def run_load_in_processes(cfg: LoadConfig, workers: int, advance: Callable[[], None] | None = None
                          ) -> tuple[list[RequestRecord], float]:
    """run_load's result (records in submission order, duration) from `workers` processes.
    advance() is called once per finished request, as it finishes."""
    prompts = make_prompts(cfg)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    go, start = ctx.Event(), ctx.Value("d", 0.0)  # the load's start, once every worker is ready
    procs = [ctx.Process(target=_worker, args=(share, idx, [prompts[i] for i in idx], go, start, results),
                         daemon=True) for share, idx in shares(cfg, workers)]
    for p in procs:
        p.start()
    records: list[RequestRecord | None] = [None] * cfg.num_requests
    ready = ended = 0
    t0 = time.perf_counter()  # replaced by the load's start

    def begin() -> float:
        start.value = time.perf_counter()
        go.set()
        return start.value

    while ended < len(procs):
        try:
            kind, payload = results.get(timeout=0.2)
        except queue.Empty:
            if not any(p.is_alive() for p in procs):
                break  # a worker died without reporting: its requests count as errors below
            if not go.is_set() and not all(p.is_alive() for p in procs):
                t0 = begin()  # one died before it was ready: the others go on without it
            continue
        except KeyboardInterrupt:
            if not go.is_set():  # nothing sent yet: stop the workers where they wait
                for p in procs:
                    p.terminate()
                break
            for p in procs:  # stop every worker as one process stops on Ctrl-C
                if p.pid is not None and p.is_alive():
                    os.kill(p.pid, signal.SIGINT)
            continue
        if kind == "ready":
            ready += 1
            if ready == len(procs):
                t0 = begin()
        elif kind == "done":
            if advance:
                advance()
        else:
            indices, recs = payload
            for i, r in zip(indices, recs, strict=True):
                records[i] = RequestRecord(**r)
            ended += 1
    for p in procs:
        p.join(timeout=10)
    duration = time.perf_counter() - t0
    return [r or RequestRecord(start=duration, error="worker lost") for r in records], duration
