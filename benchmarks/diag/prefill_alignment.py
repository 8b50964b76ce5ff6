"""Diagnostic: does the prefill attention kernel's `do_not_specialize_on_alignment` (1cab2a3) cost
the 20b's 8 x 2048 prefill? One engine, the kernel swapped between its current form and one that
specialises on the tables' alignment again, alternating, each the median of three prefills.

    PYTHONPATH=$PWD python3 benchmarks/diag/prefill_alignment.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import itertools
import statistics

import triton

from osserve.bench.latency import run_once
from osserve.engine.load import EngineArgs, build_engine
from osserve.ops.attention import paged_triton


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    engine = build_engine(EngineArgs(load_format="dummy", preset="20b", max_model_len=8192, max_num_seqs=64,
                                     max_num_batched_tokens=16384, gpu_memory_utilization=0.90))
    kernels = {"unaligned (current)": paged_triton._prefill_kernel,
               "aligned (before 1cab2a3)": triton.jit(paged_triton._prefill_kernel.fn,
                                                      do_not_specialize=["window", "stride_bt"])}
    results: dict[str, list[float]] = {k: [] for k in kernels}
    seeds = itertools.count(10)  # new prompts each run: none served from the prefix cache
    for kernel in kernels.values():  # each compiled and warmed first
        paged_triton._prefill_kernel = kernel
        run_once(engine, 8, 2048, 2, seed=next(seeds))
    for _ in range(args.rounds):
        for name, kernel in kernels.items():
            paged_triton._prefill_kernel = kernel
            runs = [run_once(engine, 8, 2048, 2, seed=next(seeds)).prefill_tok_s for _ in range(3)]
            results[name].append(statistics.median(runs))
            print(f"{name}: {', '.join(f'{r:.0f}' for r in runs)} tok/s", flush=True)
    print("\n| kernel | prefill 8 x 2048, tok/s (median of 3, each round) |\n|---|---|")
    for name, meds in results.items():
        print(f"| {name} | {' / '.join(f'{m:,.0f}' for m in meds)} |")


if __name__ == "__main__":
    main()
