"""Where a tensor-parallel engine on GPUs stalls: two x2 runs of tp_bench.py (the second on
2026-11-26) built the 120b's TP 2 ranks, captured their graphs, then printed nothing for minutes.
Builds the engine at TP N on the dummy weights and steps one short greedy request (or tp_bench's
8 prompts), printing each step; run it beside py-spy (the history file, "A multi-GPU attempt"):

    timeout 120 python3 benchmarks/diag/tp_hang.py --preset 20b --tp 2 [--bench-prompts | --run-layout] &
    sleep 100; py-spy dump --pid PID

benchmarks/diag/tp_hang.sh does both, with every rank's steps traced. Found (2 x H200, 5aaf193):
the steps ran; rank 0 then waited in the NCCL communicator's abort at shutdown (history file,
"Tensor parallelism on 2 GPUs").
"""

from __future__ import annotations

import argparse
import logging
import time

from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.load import EngineArgs, build_engine


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--eager", action="store_true", help="no CUDA graphs")
    ap.add_argument("--bench-prompts", action="store_true", help="tp_bench.py's 8 prompts (5-1000 tokens), 32 steps")
    ap.add_argument("--run-layout", action="store_true",
                    help="tp_bench.run_layout's whole flow instead (its engine settings, no TP 1 reference)")
    args = ap.parse_args()
    if args.run_layout:
        from benchmarks.tp_bench import run_layout

        run_layout(args.preset, args.tp, False, None, 64, 0.90)
        print("done", flush=True)
        return
    start = time.perf_counter()
    engine = build_engine(EngineArgs(load_format="dummy", preset=args.preset, max_model_len=2048, max_num_seqs=8,
                                     tensor_parallel_size=args.tp, gpu_memory_utilization=0.5,
                                     enforce_eager=args.eager))
    print(f"built in {time.perf_counter() - start:.1f} s", flush=True)
    if args.bench_prompts:
        from benchmarks.tp_bench import STEPS, prompts

        for i, p in enumerate(prompts()):
            engine.add_request(f"g{i}", p, SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True))
    else:
        engine.add_request("r", list(range(100, 140)), SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    step = 0
    while engine.has_unfinished():
        t = time.perf_counter()
        outs = engine.step()
        step += 1
        print(f"step {step}: {time.perf_counter() - t:.3f} s, {[o.new_token_ids for o in outs]}", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
