"""The portable kernels (ops/policy.py: no Gluon MoE, no PDL, no sm_90 PTX: what an A100, A10, L4 or
RTX 4090 runs) measured on the lent GPU beside the Hopper ones, in one call:

1. decode of the 20b (random weights of the real shapes; prompt 1024, 512 out, greedy), batch 1 and
   batch 32, two runs each, by `osserve bench latency`'s own measurement (bench/latency.py's
   run_once) on one engine per path and round, the Hopper path first (each in a process of its
   own, so neither inherits the other's memory or compiled kernels). Each engine is `osserve
   serve`'s (--max-model-len 32768, 256 running requests, --gpu-memory-utilization 0.9) on a card
   held to an A10's 22.2 GiB (OSSERVE_GPU_MEMORY_GB, engine/memory.py: the plan takes that size and
   PyTorch's allocator is held to it), so the memory-plan lines printed are a 24 GB card's plan made
   by the real loader, fragmentation and all (--card-gb 0: the whole card);
2. the GPU suite with the portable path forced (OSSERVE_PORTABLE_KERNELS=1) and tl.dot lowered to
   mma.sync as on Ampere and Ada (DISABLE_MMA_V3=1; --suite-wgmma: Hopper's wgmma): every kernel
   against its reference and the engine's fast path against the reference path; the Gluon and PDL
   tests skip, saying why. It gets what is left of --budget-s after the benchmarks.

A table of every figure and the suite's summary is printed last. Figures on an H100 are lower bounds
for what the portable code does there, not an A100's or an A10's figures.

    source benchmarks/gpu_env.sh; python3 benchmarks/portable_ab.py [--rounds 1] [--budget-s 530]
    (carry .whl; about 3 minutes of benchmarks, then the suite). --suite-only / --bench-only: one part.

The same figures one at a time: `OSSERVE_GPU_MEMORY_GB=22.2 osserve bench latency --load-format dummy
--preset 20b --batch-size 1 --max-model-len 32768 [--portable-kernels]`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from osserve.engine.memory import SIMULATED_GPU_ENV

# name -> (--portable-kernels, environment). Forced on an H100, the portable kernels' tl.dot still
# becomes Hopper's wgmma; with DISABLE_MMA_V3=1 (Triton's switch) it becomes mma.sync, the
# instruction an A100, A10 or L4 runs, with the same shared-memory use as there
# (benchmarks/compile_targets.py: 24,832 bytes for the swapped MoE's 16-token tile on sm_86 and so).
PATHS = {"hopper": (False, {}), "portable": (True, {}), "portable-mma-v2": (True, {"DISABLE_MMA_V3": "1"})}
AMPERE_MMA = {"DISABLE_MMA_V3": "1"}
BATCHES = (1, 32)
RUNS = 2


def one_path(name: str, out: Path, model: str = "20b", device: str | None = None) -> None:
    """In this process: one engine on `name`'s kernels, batch 1 and 32 decode, written to `out`
    (model and device: a smoke run of this script on the CPU's tiny model)."""
    import torch

    from osserve.bench.latency import run_once
    from osserve.engine.load import EngineArgs, build_engine

    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith(("memory plan", "KV cache: ")):
                lines.append(record.getMessage())

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("osserve").addHandler(Keep())
    engine = build_engine(EngineArgs(load_format="dummy", preset=model, device=device, max_model_len=32768,
                                     portable_kernels=PATHS[name][0]))
    prompt, output = (1024, 512) if model != "tiny" else (16, 4)
    run_once(engine, 1, 128, 16, seed=99)  # warm-up: compile whatever build_engine's warm-up left
    results = {f"b{b}": [asdict(run_once(engine, b, prompt, output, seed=10 * b + r)) for r in range(RUNS)]
               for b in BATCHES}
    peak = torch.cuda.max_memory_reserved() / 2**30 if torch.cuda.is_available() else 0.0
    out.write_text(json.dumps({"path": name, "kernels": engine.runner.policy.describe(), "log": lines, "peak": peak,
                               "device": torch.cuda.get_device_name() if engine.runner.device.type == "cuda"
                               else "cpu", "results": results}, indent=1))


def suite(timeout: float, log: Path, mma: dict[str, str]) -> str:
    """The GPU suite with the portable kernels forced (and `mma`'s environment); its summary line."""
    if timeout < 30:
        return "not run: no time left (python3 benchmarks/portable_ab.py --suite-only)"
    env = os.environ | {"OSSERVE_PORTABLE_KERNELS": "1"} | mma
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests/gpu"]
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        log.write_text(out)
        return f"timed out after {timeout:.0f} s (python3 benchmarks/portable_ab.py --suite-only)"
    log.write_text(done.stdout + done.stderr)
    print(done.stdout[-6000:])
    summary = [line for line in done.stdout.splitlines()
               if re.search(r"\b\d+ (passed|failed|errors?|skipped)\b.* in [\d.]+s", line)]
    return (summary[-1].strip("= ") if summary else "no summary") + f" (exit {done.returncode})"


def table(files: list[Path], suite_line: str) -> str:
    rows = ["| path | batch | decode tok/s (each run) | TPOT p50 ms | prefill tok/s | kernels |",
            "|---|---|---|---|---|---|"]
    medians: dict[tuple[str, str], list[float]] = {}
    for batch in (f"b{b}" for b in BATCHES):
        for f in files:
            data = json.loads(f.read_text())
            runs = data["results"][batch]
            medians.setdefault((data["path"], batch), []).extend(r["decode_tok_s"] for r in runs)
            tok = " / ".join(f"{r['decode_tok_s']:,.1f}" for r in runs)
            tpot = " / ".join(f"{r['tpot_median_ms']:.3f}" for r in runs)
            prefill = statistics.median(r["prefill_tok_s"] for r in runs)
            rows.append(f"| {data['path']} | {batch[1:]} | {tok} | {tpot} | {prefill:,.0f} | {data['kernels']} |")
    rows.append("")
    for batch in (f"b{b}" for b in BATCHES):
        for name in (n for n in PATHS if n != "hopper"):
            if ("hopper", batch) in medians and (name, batch) in medians:
                ratio = statistics.median(medians[(name, batch)]) / statistics.median(medians[("hopper", batch)])
                rows.append(f"batch {batch[1:]}: {name} / Hopper decode tok/s = {ratio:.3f} (medians)")
    for f in files:  # the plan on the card as held (OSSERVE_GPU_MEMORY_GB)
        data = json.loads(f.read_text())
        rows.append(f"{data['path']}: {' | '.join(data['log'])} | peak reserved {data['peak']:.2f} GiB")
    if files:
        rows.append(f"GPU: {json.loads(files[0].read_text())['device']}")
    rows.append(f"GPU suite with OSSERVE_PORTABLE_KERNELS=1: {suite_line}")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--budget-s", type=float, default=530.0, help="the whole run's; the suite gets what is left")
    ap.add_argument("--out", default=os.environ.get("OUT") or "/tmp/portable-ab")
    ap.add_argument("--card-gb", type=float, default=22.2,
                    help="hold the card to this many GiB for the benchmarks (an A10's 24 GB as PyTorch sees "
                         "them); 0: the whole card")
    ap.add_argument("--ampere-mma", action="store_true",
                    help="a third engine: the portable kernels with DISABLE_MMA_V3=1 (mma.sync, as on Ampere/Ada)")
    ap.add_argument("--suite-wgmma", action="store_true",
                    help="run the suite's portable kernels with Hopper's wgmma (default: DISABLE_MMA_V3=1, Ampere's "
                         "mma.sync, the closest the H100 comes to an A10)")
    ap.add_argument("--suite-only", action="store_true")
    ap.add_argument("--bench-only", action="store_true")
    ap.add_argument("--one", choices=PATHS, help=argparse.SUPPRESS)  # the child process of one engine
    ap.add_argument("--json", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)  # the tiny model on the CPU
    args = ap.parse_args()
    if args.one:
        one_path(args.one, Path(args.json), *(("tiny", "cpu") if args.smoke else ()))
        return 0
    start = time.monotonic()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.smoke:
        subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"])
    files: list[Path] = []
    failures: list[str] = []
    if not args.suite_only:
        for round_ in range(1, args.rounds + 1):
            for name in [n for n in PATHS if n != "portable-mma-v2" or args.ampere_mma]:
                print(f"== {time.strftime('%T')} {name} kernels, round {round_}", flush=True)
                path = out / f"ab-{name}-{round_}.json"
                env = os.environ | PATHS[name][1] | ({SIMULATED_GPU_ENV: str(args.card_gb)} if args.card_gb else {})
                done = subprocess.run([sys.executable, __file__, "--one", name, "--json", str(path),
                                       *(["--smoke"] if args.smoke else [])], capture_output=True, text=True, env=env)
                lines = [line for line in done.stderr.splitlines() if "memory plan" in line or "KV cache: " in line]
                print("\n".join(lines) if done.returncode == 0 else done.stderr[-4000:], flush=True)
                if done.returncode != 0:  # on with the rest: the table says what failed, and why
                    said = [line for line in done.stderr.splitlines() if line.strip()]
                    failures.append(f"{name} round {round_} failed: {said[-1] if said else done.returncode}")
                    continue
                files.append(path)
    suite_line = "not run (--bench-only)"
    if not args.bench_only:
        left = args.budget_s - (time.monotonic() - start)
        print(f"== {time.strftime('%T')} GPU suite, portable kernels forced ({left:.0f} s left)", flush=True)
        mma = {} if args.suite_wgmma else AMPERE_MMA
        suite_line = f"{' '.join(f'{k}={v}' for k, v in mma.items())} " + suite(left, out / "suite.log", mma)
    print()
    print(table(files, suite_line))
    print("\n".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
