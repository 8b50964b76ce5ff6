"""Decode-size MoE: the swapped kernel (weights as the dot's left operand, moe/swapped.py) against
the token-tiled fused kernel (moe/tiled.py), same run, gpt-oss-20b and -120b shapes.

Run on the GPU: PYTHONPATH=$PWD python3 benchmarks/bench_moe_decode.py [--tokens 1,32] [--no-sweep]
[--baseline OLD_moe_swapped.py]
Correctness first (bf16 vs the float32 reference, every candidate, several batch sizes), then
CUDA-graph timings over L layers with distinct weights (so L2 cannot hold them), / L.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from dataclasses import replace
from functools import partial

import torch

from benchmarks.bench_moe import EXPERT_BYTES, graph_time_us
from osserve.ops.moe.layout import prepare_mxfp4_experts
from osserve.ops.moe.reference import moe_reference
from osserve.ops.moe.swapped import PROGRAMS_PER_SM, SwappedConfig, fused_moe_swapped
from osserve.ops.moe.swapped import pick_config as pick_swapped
from osserve.ops.moe.tiled import fused_moe_triton, pick_config
from osserve.ops.moe.weights import PreparedExperts
from tests.ops.moe_fixtures import random_experts, random_routing

HIDDEN = INTER = 2880
TOP_K, LIMIT = 4, 7.0
MODELS = {"20b": (32, 4), "120b": (128, 2)}


# (block_t, block_w, block_k, warps, stages) tried for both GEMMs besides the defaults.
SHAPES = [(16, 64, 128, 4, 4), (16, 64, 256, 4, 3), (16, 64, 64, 4, 4), (16, 128, 128, 8, 3),
          (32, 64, 128, 4, 3), (32, 64, 128, 4, 4), (32, 64, 256, 4, 3), (32, 128, 128, 8, 3), (32, 64, 64, 4, 4),
          (64, 64, 128, 4, 3), (64, 64, 128, 4, 4), (64, 128, 128, 8, 3), (64, 64, 256, 4, 3), (64, 128, 64, 8, 4),
          (128, 64, 128, 4, 3), (128, 128, 64, 8, 3)]


def candidates(t: int, num_experts: int, sms: int) -> list[tuple[SwappedConfig, int]]:
    """(config, min_programs) pairs to time at T tokens: the default config with K split to fill
    1 (no split), 2, 4 or 8 programs per SM, and other tile shapes (token tiles up to twice the
    slots an expert gets)."""
    base = pick_swapped(t, num_experts, TOP_K)
    out = [(base, m * sms) for m in (0, 2, 4, 8)]
    out += [(SwappedConfig(bt, bw, bk, w, st, bw, bk, w, st, True), PROGRAMS_PER_SM * sms)
            for bt, bw, bk, w, st in SHAPES]
    return [(cfg, max(m, 1)) for cfg, m in out
            if cfg.block_t <= 2 * max(16, triton_next_pow2(t * TOP_K // num_experts))]


def row_major_scales(p: PreparedExperts) -> PreparedExperts:
    """The same experts with the scales stored row-major (the layout before group-major)."""
    return replace(p, s1=p.s1.contiguous(), s2=p.s2.contiguous())


def load_baseline(path: str | None):  # type: ignore[no-untyped-def]
    """An older moe/swapped.py (e.g. `git show REV:osserve/ops/moe/swapped.py > F`) to time in the
    same run; it reads row-major scales."""
    if not path or not os.path.exists(path):
        return None
    spec = importlib.util.spec_from_file_location("baseline_moe_swapped", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def kernel_times(fns: list, rounds: int = 5) -> dict[str, float]:  # type: ignore[type-arg]
    """Mean CUDA µs per call of each kernel the calls `fns` launch (eager, PyTorch profiler), after
    one warm-up call each."""
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(rounds):
            for fn in fns:
                fn()
        torch.cuda.synchronize()
    calls = rounds * len(fns)
    return {ev.key[:40]: ev.device_time_total / calls for ev in prof.key_averages() if ev.device_time_total > 0}


def kernel_breakdown(prepared: list, num_experts: int, t: int) -> dict[str, float]:
    """Mean CUDA µs per layer of each kernel of the default swapped path."""
    x = torch.randn(t, HIDDEN, device="cuda").bfloat16()
    w, ids = random_routing(t, num_experts, TOP_K, device="cuda")
    return kernel_times([partial(fused_moe_swapped, x, w.bfloat16(), ids, p, LIMIT) for p in prepared])


def timing_inputs(t: int, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(x bf16, router weights bf16, expert ids, experts hit) for a timing at T tokens: uniform routing."""
    x = torch.randn(t, HIDDEN, device="cuda").bfloat16()
    w, ids = random_routing(t, num_experts, TOP_K, device="cuda")
    return x, w.bfloat16(), ids, torch.unique(ids).numel()


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="1,8,32,64,256,1024")
    parser.add_argument("--baseline", help="an older moe/swapped.py to time beside the current one")
    parser.add_argument("--no-sweep", action="store_true", help="time the default configurations only")
    args = parser.parse_args()
    baseline = load_baseline(args.baseline)
    tokens = [int(t) for t in args.tokens.split(",")]
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    print(f"GPU {props.name}, {sms} SMs; torch {torch.__version__}", flush=True)
    results: list[dict] = []
    for model, (num_experts, layers) in MODELS.items():
        torch.manual_seed(0)
        originals = [random_experts(num_experts, HIDDEN, INTER, device="cuda") for _ in range(layers)]
        prepared = [prepare_mxfp4_experts(e) for e in originals]
        for e in originals[1:]:
            e.gate_up_blocks = e.gate_up_scales = e.down_blocks = e.down_scales = None
        torch.cuda.empty_cache()
        # Correctness first: both kernels, split and not, skewed routing too; fresh inputs each time.
        for t, mode in ((1, "uniform"), (7, "uniform"), (64, "skewed"), (300, "sparse")):
            x = torch.randn(t, HIDDEN, device="cuda").bfloat16()
            w, ids = random_routing(t, num_experts, TOP_K, mode, device="cuda")
            ref = moe_reference(x.float(), w, ids, originals[0], LIMIT)
            errs = [rel_err(fused_moe_triton(x, w.bfloat16(), ids, prepared[0], LIMIT), ref)]
            errs += [rel_err(fused_moe_swapped(x, w.bfloat16(), ids, prepared[0], LIMIT, min_programs=m), ref)
                     for m in (1, PROGRAMS_PER_SM * sms, 10**6)]
            errs.append(rel_err(fused_moe_swapped(x, w.bfloat16(), ids, row_major_scales(prepared[0]), LIMIT), ref))
            print(f"check {model} T={t} {mode}: token-tiled / swapped (no split, default, max split, "
                  "row-major scales) err "
                  + " / ".join(f"{e:.2e}" for e in errs), flush=True)
            assert all(e < 1e-2 for e in errs), errs
        for t in tokens:
            x, w, ids, hit = timing_inputs(t, num_experts)
            base = graph_time_us([partial(fused_moe_triton, x, w, ids, p, LIMIT) for p in prepared])
            results.append(dict(model=model, T=t, kernel="token-tiled", cfg=str(pick_config(t)), us=base, hit=hit))
            print(f"time {model} T={t} token-tiled {base:.1f} us", flush=True)
            default_pair = (pick_swapped(t, num_experts, TOP_K), PROGRAMS_PER_SM * sms)
            if baseline is not None:  # same run: the older kernel, and the current one on row-major scales
                rows = [row_major_scales(p) for p in prepared]
                for label, fn in (("baseline", baseline.fused_moe_swapped), ("row-major", fused_moe_swapped)):
                    us = graph_time_us([partial(fn, x, w, ids, p, LIMIT, *default_pair) for p in rows])
                    results.append(dict(model=model, T=t, kernel=label, cfg=str(default_pair[0]), us=us, hit=hit))
                    print(f"time {model} T={t} {label}: {us:.1f} us", flush=True)
                rows = []
            sweep = model == "20b" and not args.no_sweep
            for cfg, min_programs in candidates(t, num_experts, sms) if sweep else [default_pair]:
                us = graph_time_us([partial(fused_moe_swapped, x, w, ids, p, LIMIT, cfg, min_programs)
                                    for p in prepared])
                default = (cfg, min_programs) == default_pair
                results.append(dict(model=model, T=t, kernel="swapped" + ("*" if default else ""),
                                    cfg=f"{cfg} min_programs={min_programs}", us=us, hit=hit))
                print(f"time {model} T={t} {results[-1]['cfg']}: {us:.1f} us", flush=True)
        for t in (1, 32) if model == "20b" else (1,):
            parts = kernel_breakdown(prepared, num_experts, t)
            print(f"breakdown {model} T={t} (us per layer): " +
                  ", ".join(f"{k} {v:.1f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])), flush=True)
        originals = prepared = []
        torch.cuda.empty_cache()
    out_dir = os.environ.get("OUT")
    if out_dir:
        with open(os.path.join(out_dir, "moe_decode.json"), "w") as f:
            json.dump(results, f, indent=1)
    print("\nmodel     T  hit  kernel        us/layer   GB/s  config   (* = the default the engine runs)")
    for r in results:
        gbs = r["hit"] * EXPERT_BYTES / (r["us"] * 1e-6) / 1e9
        print(f"{r['model']:>5} {r['T']:5d} {r['hit']:4d}  {r['kernel']:<12} {r['us']:9.1f} {gbs:6.0f}  {r['cfg']}")


def triton_next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


if __name__ == "__main__":
    main()
