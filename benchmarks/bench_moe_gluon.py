"""The Gluon MoE kernel (moe/gluon.py, MMA-fragment weight layout) against the Triton swapped kernel
(moe/swapped.py, the engine's default before it), same run, gpt-oss-20b and -120b shapes.

Run on the GPU: PYTHONPATH=$PWD python3 benchmarks/bench_moe_gluon.py [--tokens 1,8,32,256] [--profile]
[--quick | --grid 3,4:8,16]
Correctness first (bf16 vs the float32 reference at several batch sizes and routings, split K and
not, the 64-column K tail, shared-memory rings of 2-4 steps), then, with --profile, each kernel's
share of a layer (torch.profiler), then CUDA-graph timings over L layers with distinct weights, / L;
a table last. --quick: no checks, the default kernel only (to time two trees in one call, the
older one through PYTHONPATH); --grid: no checks, only ring depths x token tiles.
"""

from __future__ import annotations

import argparse
from functools import partial

import torch

from benchmarks.bench_moe import EXPERT_BYTES, graph_time_us
from benchmarks.bench_moe_decode import HIDDEN, INTER, LIMIT, MODELS, TOP_K, kernel_times, rel_err, timing_inputs
from osserve.ops.moe.gluon import fused_moe_gluon
from osserve.ops.moe.layout import prepare_mxfp4_experts
from osserve.ops.moe.reference import moe_reference
from osserve.ops.moe.swapped import fused_moe_swapped
from tests.ops.moe_fixtures import random_experts, random_routing

RINGS = (2, 3, 4)  # shared-memory ring depths checked


def check(originals, fragments, num_experts: int, label: str) -> None:
    for t, mode in ((1, "uniform"), (2, "uniform"), (7, "uniform"), (64, "skewed"), (300, "sparse"),
                    (4096, "uniform"), (5000, "uniform")):
        x = torch.randn(t, HIDDEN, device="cuda").bfloat16()
        w, ids = random_routing(t, num_experts, TOP_K, mode, device="cuda")
        ref = moe_reference(x.float(), w, ids, originals, LIMIT)
        for stages in RINGS:
            errs = [rel_err(fused_moe_gluon(x, w.bfloat16(), ids, fragments, LIMIT, None, m, stages), ref)
                    for m in (1, None, 10**6)]
            errs += [rel_err(fused_moe_gluon(x, w.bfloat16(), ids, fragments, LIMIT, bt, None, stages), ref)
                     for bt in (8, 16, 32, 64)]
            errs += [rel_err(fused_moe_gluon(x, w.bfloat16(), ids, fragments, LIMIT, stages=stages, gate_up_tiles=n),
                             ref) for n in (1, 2)]
            print(f"check {label} T={t} {mode} stages {stages}: gluon (no split, default, max split, bt8, bt16, "
                  "bt32, bt64, 1 and 2 gate/up tiles) err " + " / ".join(f"{e:.2e}" for e in errs), flush=True)
            assert all(e < 1e-2 for e in errs), errs


def profile(fn, label: str) -> None:  # type: ignore[no-untyped-def]
    """Each kernel's mean GPU time in one call of fn (bench_moe_decode.kernel_times, 20 calls)."""
    kernels = kernel_times([fn], rounds=20)
    print(f"profile {label}: {sum(kernels.values()):.1f} us of kernels: "
          + "; ".join(f"{name} {us:.1f}" for name, us in sorted(kernels.items(), key=lambda k: -k[1])), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="1,8,32,64,128,256,512,1024")
    parser.add_argument("--profile", action="store_true", help="each kernel's time at T=1, 8, 32 (20b)")
    parser.add_argument("--quick", action="store_true",
                        help="no checks, no variants: the default kernel's times (to compare two trees in one call)")
    parser.add_argument("--grid", default=None, metavar="STAGES:TILES",
                        help="only these variants, e.g. 3,4,6:8,16 (ring depths x token tiles, 1 program per SM)")
    parser.add_argument("--ab-ws", action="store_true",
                        help="with --quick: also time the K loops without the copy warp (moe/gluon_ws.py)")
    args = parser.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]
    props = torch.cuda.get_device_properties(0)
    print(f"GPU {props.name}, {props.multi_processor_count} SMs; torch {torch.__version__}", flush=True)
    # K = 2880 ends on a 64-column tail; a K of whole 128-column steps is checked on a small layer too.
    torch.manual_seed(1)
    small = random_experts(8, 256, 384, device="cuda")
    x = torch.randn(33, 256, device="cuda").bfloat16()
    w, ids = random_routing(33, 8, TOP_K, device="cuda")
    for stages in RINGS:
        err = rel_err(fused_moe_gluon(x, w.bfloat16(), ids, prepare_mxfp4_experts(small, fragments=True), LIMIT,
                                      stages=stages), moe_reference(x.float(), w, ids, small, LIMIT))
        print(f"check H=256 I=384 T=33 stages {stages}: err {err:.2e}", flush=True)
        assert err < 1e-2
    rows = []
    for model, (num_experts, layers) in MODELS.items():
        torch.manual_seed(0)
        originals = [random_experts(num_experts, HIDDEN, INTER, device="cuda") for _ in range(layers)]
        swapped = [prepare_mxfp4_experts(e) for e in originals]
        gluon = [prepare_mxfp4_experts(e, fragments=True) for e in originals]
        if not (args.quick or args.grid):
            check(originals[0], gluon[0], num_experts, model)
        for e in originals:
            e.gate_up_blocks = e.gate_up_scales = e.down_blocks = e.down_scales = None
        torch.cuda.empty_cache()
        if args.profile and model == "20b":
            for t in (1, 8, 32):
                x, w, ids, _ = timing_inputs(t, num_experts)
                profile(partial(fused_moe_gluon, x, w, ids, gluon[0], LIMIT), f"{model} T={t}")
        for t in tokens:
            x, w, ids, hit = timing_inputs(t, num_experts)
            base = graph_time_us([partial(fused_moe_swapped, x, w, ids, p, LIMIT) for p in swapped])
            new = graph_time_us([partial(fused_moe_gluon, x, w, ids, p, LIMIT) for p in gluon])
            variants = {"default": new}
            if args.ab_ws:
                variants["no copy warp"] = graph_time_us(
                    [partial(fused_moe_gluon, x, w, ids, p, LIMIT, ws=False) for p in gluon])
            ring_depths, token_tiles, per_sm = (3, 4), (8, 16, 32, 64), (1, 2)
            if args.grid:
                depths, tiles = args.grid.split(":")
                ring_depths, token_tiles, per_sm = tuple(map(int, depths.split(","))), tuple(
                    map(int, tiles.split(","))), (1,)
            extras = not (args.quick or args.grid)
            for stages in ring_depths if not args.quick else ():
                for bt in token_tiles:
                    for m in per_sm:
                        variants[f"st{stages} bt{bt} {m}/SM"] = graph_time_us(
                            [partial(fused_moe_gluon, x, w, ids, p, LIMIT, bt, m * props.multi_processor_count, stages)
                             for p in gluon])
            # one or two 64-row gate/up tiles per program; the down GEMM's K split alone
            for n in (1, 2) if extras else ():
                variants[f"{n} gate/up tiles"] = graph_time_us(
                    [partial(fused_moe_gluon, x, w, ids, p, LIMIT, gate_up_tiles=n) for p in gluon])
            if t <= 32 and extras:
                for m in (1, 2, 3):
                    down_min = m * props.multi_processor_count
                    variants[f"down {m}/SM"] = graph_time_us(
                        [partial(fused_moe_gluon, x, w, ids, p, LIMIT, down_min_programs=down_min) for p in gluon])
            best = min(variants, key=variants.get)
            rows.append((model, t, hit, base, new, best, variants[best]))
            print(f"time {model} T={t}: swapped {base:.1f} us, gluon {new:.1f} us; "
                  + ", ".join(f"{k} {v:.1f}" for k, v in variants.items()), flush=True)
        originals = swapped = gluon = []
        torch.cuda.empty_cache()
    print("\nmodel     T  hit  swapped us  gluon us  speedup  gluon GB/s  best variant")
    for model, t, hit, base, new, best, best_us in rows:
        gbs = hit * EXPERT_BYTES / (new * 1e-6) / 1e9
        print(f"{model:>5} {t:5d} {hit:4d}  {base:10.1f} {new:9.1f} {base / new:8.2f} {gbs:10.0f}  "
              f"{best} {best_us:.1f}")


if __name__ == "__main__":
    main()
