"""Where the GPU's time goes in chosen windows of a server's steps, and where it idles: in every
Python process started with this folder on PYTHONPATH and OSSERVE_GPU_TIMELINE="A-B,C-D" (engine
steps, counted as the `engine:` log counts them), the engine records its GPU's kernels and copies
(torch.profiler, CUDA activity only: no host-side tracing to slow the loop) over each window and
logs a line: wall ms a step, the GPU busy ms a step (kernels and copies of every stream, overlaps
counted once), its idle gaps (how many over 50 us and their ms a step, and between which kernels
they fell: what the GPU waited for), and the kernels that took the most time. A json round against
a plain one on one server tells whether a json step is longer on the GPU or leaves it idle:

    OSSERVE_GPU_TIMELINE=600-660,1600-1660 DIAG_PATH=$PWD/benchmarks/diag/gpu_timeline \\
        SKIP_ENGINE=1 RUNS="plain json" bash benchmarks/structured_ab.sh
"""

import json
import logging
import os
import tempfile
import time

WINDOWS = [tuple(int(x) for x in w.split("-")) for w in os.environ.get("OSSERVE_GPU_TIMELINE", "").split(",") if w]

if WINDOWS:
    from osserve.engine.engine import LLMEngine

    log = logging.getLogger("osserve")
    original = LLMEngine.step
    state: dict = {"profiler": None, "window": None}

    def summarise(path: str, steps: int, wall: float, batch: float) -> str:
        events = sorted((e for e in json.load(open(path))["traceEvents"]
                         if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                        key=lambda e: e["ts"])
        busy = idle = 0.0
        gaps = 0
        end = events[0]["ts"] if events else 0.0
        last = ""  # the event that ended last before a gap
        between: dict[str, list[float]] = {}  # "last -> next": [gaps, idle us]
        for e in events:
            a, b = e["ts"], e["ts"] + e["dur"]
            if a > end + 50:
                gaps += 1
                idle += a - end
                where = between.setdefault(f"{last[:40]} -> {e['name'][:40]}", [0, 0.0])
                where[0] += 1
                where[1] += a - end
            busy += max(0.0, b - max(a, end))
            if b >= end:
                end, last = b, e["name"]
        by_name: dict[str, float] = {}
        for e in events:
            by_name[e["name"][:60]] = by_name.get(e["name"][:60], 0.0) + e["dur"]
        top = sorted(by_name.items(), key=lambda kv: -kv[1])[:12]
        where_idle = sorted(between.items(), key=lambda kv: -kv[1][1])[:6]
        span = (end - events[0]["ts"]) if events else 0.0
        return (f"{steps} steps, mean batch {batch:.1f}: wall {1000 * wall / steps:.2f} ms a step; GPU from first to "
                f"last event {span / 1000 / steps:.2f}, busy {busy / 1000 / steps:.2f}, idle gaps over 50 us "
                f"{gaps / steps:.2f} a step, {idle / 1000 / steps:.2f} ms a step; the gaps, after -> before (gaps, "
                f"ms a step): " + "; ".join(f"{k} ({n / steps:.2f}, {t / 1000 / steps:.3f})"
                                            for k, (n, t) in where_idle)
                + "; top (ms a step): " + ", ".join(f"{n} {d / 1000 / steps:.3f}" for n, d in top))

    def step(self):  # type: ignore[no-untyped-def]
        import torch

        n = self.profile.steps
        if state["profiler"] is None:
            for a, b in WINDOWS:
                if n == a:
                    kind = "CUDA" if torch.cuda.is_available() else "CPU"  # CPU: the script's own check
                    prof = torch.profiler.profile(activities=[getattr(torch.profiler.ProfilerActivity, kind)])
                    prof.start()
                    state.update(profiler=prof, window=(a, b), t0=time.perf_counter(), requests=self.profile.requests)
        out = original(self)
        if state["profiler"] is not None and self.profile.steps >= state["window"][1]:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            wall = time.perf_counter() - state["t0"]
            prof = state["profiler"]
            prof.stop()
            a, b = state["window"]
            steps = max(1, self.profile.steps - a)
            batch = (self.profile.requests - state["requests"]) / steps
            path = os.path.join(tempfile.gettempdir(), f"gpu-timeline-{os.getpid()}-{a}.json")
            prof.export_chrome_trace(path)
            log.info("gpu timeline: steps %d-%d: %s", a + 1, self.profile.steps, summarise(path, steps, wall, batch))
            state.update(profiler=None, window=None)
        return out

    LLMEngine.step = step
