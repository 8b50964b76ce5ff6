"""Where a 20b decode step of the 1k/1k serving load goes (one GPU, random weights): 256 requests of
1,000 unique random prompt tokens, sampled at temperature 1 with ignore_eos as `osserve bench
serve` sends them, run in the engine alone (no HTTP). Prints the wall time of decode-only steps by
mean context, then the kernels of one eager decode step at ~1.5k context (PyTorch profiler, CUDA
time by kernel, grouped), table printed last.

    PYTHONPATH=$PWD python3 benchmarks/diag/serving_step.py [--preset 20b] [--batch 256] \\
        [--kv-cache-dtype fp8] [--no-pdl]

--no-pdl: the profiled step's kernels launched without programmatic dependent launch (ops/pdl.py), so
that each kernel's time is its own, not its wait for the one before as well.
"""

from __future__ import annotations

import argparse
import logging
import random
import time
from collections import defaultdict

import torch

from benchmarks.bench_decode import print_kernels
from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.load import EngineArgs, build_engine
from osserve.ops import pdl


def kind_of(name: str) -> str:
    name = name.lower()
    return ("attention" if "decode_kernel" in name or "merge" in name or "attn" in name
            else "moe" if "moe" in name or "gate_up" in name or "_down_" in name or "expert" in name
            else "router" if "rout" in name or "topk" in name
            else "head/sampling" if "head" in name or "softmax" in name or "sample" in name or "exponential" in name
            or "argmax" in name or "multinomial" in name
            else "gemm" if "gemm" in name or "matmul" in name or "cublas" in name or "sm90" in name or "linear" in name
            else "norm/rope/kv" if "norm" in name or "rope" in name or "write_kv" in name or "qkv" in name
            else "other")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="20b")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=1000)
    ap.add_argument("--output", type=int, default=1024)
    ap.add_argument("--kv-cache-dtype", default="auto", help="auto (the model's dtype) or fp8")
    ap.add_argument("--no-pdl", action="store_true", help="profile the step without PDL (module docstring)")
    ap.add_argument("--device", default=None, help="cpu: a dry run of the script (tiny preset, small sizes)")
    args = ap.parse_args()
    engine = build_engine(EngineArgs(load_format="dummy", preset=args.preset, max_model_len=4096,
                                     max_num_seqs=args.batch, gpu_memory_utilization=0.90, device=args.device,
                                     kv_cache_dtype=args.kv_cache_dtype))
    cuda = engine.runner.device.type == "cuda"
    rng = random.Random(0)
    params = SamplingParams(temperature=1.0, max_tokens=args.output, ignore_eos=True, seed=None)
    for i in range(args.batch):
        engine.add_request(f"r{i}", [rng.randrange(1000, 190000) for _ in range(args.prompt)], params)
    by_ctx: dict[int, list[float]] = defaultdict(list)
    profiled = False
    steps = 0
    while engine.has_unfinished():
        running = engine.scheduler.running
        decoding = all(r.num_tokens - r.num_computed_tokens <= 1 for r in running) and not engine.scheduler.waiting
        ctx = sum(r.num_tokens for r in running) // max(1, len(running))
        if decoding and not profiled and ctx >= args.prompt + 500:
            runner = engine.runner
            graphs, mixed = runner.graphs, runner.mixed
            runner.graphs = runner.mixed = None  # eager: the graph replays the same kernels
            pdl.ENABLED = not args.no_pdl
            engine.step()
            activity = torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU
            with torch.profiler.profile(activities=[activity]) as prof:
                engine.step()
                if cuda:
                    torch.cuda.synchronize()
            runner.graphs, runner.mixed = graphs, mixed
            pdl.ENABLED = True
            events = prof.key_averages()
            print_kernels(f"decode step, batch {len(running)}, mean context {ctx}", events)
            kinds: dict[str, float] = defaultdict(float)
            for ev in events:
                kinds[kind_of(ev.key)] += (ev.device_time_total if cuda else ev.cpu_time_total) / 1000.0
            profiled = True
            continue
        start = time.perf_counter()
        engine.step()
        if decoding and len(running) == args.batch:
            by_ctx[ctx // 256 * 256].append(time.perf_counter() - start)
        steps += 1
    device = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"\n{device}, {args.preset}, batch {args.batch}, prompt {args.prompt}, {args.output} out, temperature 1, "
          f"KV cache {args.kv_cache_dtype}; "
          f"{steps} steps")
    print("| mean context | decode steps | ms a step (median) | tok/s |\n|---|---|---|---|")
    for ctx, times in sorted(by_ctx.items()):
        med = sorted(times)[len(times) // 2]
        print(f"| {ctx}-{ctx + 255} | {len(times)} | {med * 1e3:.2f} | {args.batch / med:,.0f} |")
    if profiled:
        total = sum(kinds.values())
        print("\n| kernels of one eager decode step | ms | share |\n|---|---|---|")
        for kind, ms in sorted(kinds.items(), key=lambda kv: -kv[1]):
            print(f"| {kind} | {ms:.2f} | {ms / total:.0%} |")
        print(f"| total | {total:.2f} | |")


if __name__ == "__main__":
    main()
