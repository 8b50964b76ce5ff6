"""Does the batch-1 MoE lose time to its grid's imbalance on the SMs? (a diagnostic, no checks)

At one token a 120b/20b layer's gate/up GEMM runs 4 experts x 90 weight tiles = 360 programs of
three an SM on 132 SMs: 96 SMs run three, 36 run two. If an SM's three programs are bound by what
the SM issues, the grid takes as long as 396 programs would; if the GPU's memory is the bound, it
takes 360/396 of that. This times each Gluon GEMM alone with the number of weight tiles per expert
changed (the kernels read past an expert's rows into the next expert's: valid memory, wrong
results, timing only): per-layer µs by programs, from a CUDA graph over L layers of distinct weights.
A spec may also shorten K (`--gate-up 99:2624`: 396 programs of 20.5 K steps, the time a grid with
equal work on every SM, stream-K, could reach without its fix-up) or set the down GEMM's K split
(`--down 45:2:2880`, tiles:splits:K).

Run on the GPU: PYTHONPATH=$PWD python3 benchmarks/diag/moe_balance.py [--layers 16] [--gate-up 90,99,99:2624]
[--down 45:2:2880,99:1:1312]
"""

from __future__ import annotations

import argparse
from functools import partial

import torch
import triton

from benchmarks.bench_moe import graph_time_us
from osserve.ops.moe.gluon import BLOCK_W, MAX_REGISTERS, NUM_WARPS, _down_kernel, _gate_up_kernel
from osserve.ops.moe.gluon_tiles import BLOCK_T_BY_SLOTS, STAGES_BY_BLOCK_T
from osserve.ops.moe.gluon_ws import descriptors
from osserve.ops.moe.layout import prepare_mxfp4_experts
from osserve.ops.moe.plan import align_tokens
from osserve.ops.moe.swapped import by_slots
from osserve.ops.moe.weights import SWIGLU_ALPHA, UNSCALE
from osserve.ops.pdl import pdl_launch
from tests.ops.moe_fixtures import random_experts

HIDDEN = INTER = 2880
TOP_K, LIMIT, EXPERTS = 4, 7.0, 8  # experts 0-3 get the token; 4-7 are the memory read past them


def gate_up(x, prepared, tiles: int, plan, act, k: int = HIDDEN) -> None:  # type: ignore[no-untyped-def]
    """The gate/up kernel with `tiles` 64-row weight tiles per expert (N = 32 * tiles act columns), over
    the first k of K's columns."""
    w1, s1, b1 = prepared.w1, prepared.s1, prepared.b1
    if not prepared.descriptors:
        prepared.descriptors = (*descriptors(w1, s1), *descriptors(prepared.w2, prepared.s2))
    n = tiles * BLOCK_W // 2
    bt = plan.block_m
    pdl = pdl_launch(x.device)
    _gate_up_kernel[(plan.max_blocks * tiles,)](
        x, w1, s1, *prepared.descriptors[:3], b1, act, act, plan.sorted_slots, plan.block_expert, plan.num_padded,
        TOP_K, n, k, plan.max_blocks, 1, triton.cdiv(k, 128) * 128, LIMIT,
        x.stride(0), w1.stride(0), w1.stride(1), s1.stride(0), s1.stride(1), 0, act.stride(0), 0, 0,
        TOP_K=TOP_K, BLOCK_T=bt, SPLIT=False, ALPHA=SWIGLU_ALPHA, UNSCALE=UNSCALE, STAGES=STAGES_BY_BLOCK_T[bt],
        TILES=1, PDL=pdl, WS=True, RAGGED=False, num_warps=NUM_WARPS, launch_pdl=pdl, maxnreg=MAX_REGISTERS,
    )


def down(act, prepared, tiles: int, splits: int, plan, y, topk_w,  # type: ignore[no-untyped-def]
         k: int = INTER) -> None:
    """The down kernel with `tiles` 64-row weight tiles per expert, the first k of K's columns split
    `splits` ways."""
    w2, s2, b2 = prepared.w2, prepared.s2, prepared.b2
    bt = plan.block_m
    per_split = triton.cdiv(triton.cdiv(k, 128), splits) * 128
    pdl = pdl_launch(act.device)
    _down_kernel[(plan.max_blocks * splits * tiles,)](
        act, w2, s2, *prepared.descriptors[3:], b2, y, topk_w, plan.sorted_slots, plan.block_expert,
        plan.num_padded, TOP_K, tiles * BLOCK_W, k, plan.max_blocks, splits, per_split,
        act.stride(0), w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1), 0, y.stride(0), y.stride(1),
        BLOCK_T=bt, UNSCALE=UNSCALE, STAGES=STAGES_BY_BLOCK_T[bt], PDL=pdl, WS=True, RAGGED=False, TILES=1,
        num_warps=NUM_WARPS, launch_pdl=pdl, maxnreg=MAX_REGISTERS,
    )


def ints(spec: str, defaults: list[int]) -> list[int]:
    """"90:2624" -> [90, 2624]; the values a spec leaves out from `defaults` (those after the tiles)."""
    values = [int(v) for v in spec.split(":")]
    return values + defaults[len(values) - 1:]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--gate-up", default="33,45,66,80,88,90,96,99,110,132",
                        help="tiles an expert, or tiles:K (fewer columns: a balanced grid's shorter programs)")
    parser.add_argument("--down", default="33,45,49,66", help="tiles an expert, or tiles:splits:K")
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    print(f"GPU {props.name}, {props.multi_processor_count} SMs; torch {torch.__version__}", flush=True)
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers.append(prepare_mxfp4_experts(random_experts(EXPERTS, HIDDEN, INTER, device="cuda"), fragments=True))
    x = torch.randn(1, HIDDEN, device="cuda").bfloat16()
    ids = torch.arange(TOP_K, device="cuda").view(1, TOP_K)
    topk_w = torch.full((TOP_K,), 0.25, device="cuda").bfloat16()
    plan = align_tokens(ids, EXPERTS, by_slots(BLOCK_T_BY_SLOTS, 1, 128, TOP_K))
    gate_up_specs = [ints(spec, [HIDDEN]) for spec in args.gate_up.split(",")]
    down_specs = [ints(spec, [2, INTER]) for spec in args.down.split(",")]
    max_tiles = max(spec[0] for spec in gate_up_specs)
    act = torch.zeros(plan.sorted_slots.shape[0], max_tiles * 32, device="cuda").bfloat16()
    act[:, :INTER].normal_()
    rows = []
    for tiles, k in gate_up_specs:
        us = graph_time_us([partial(gate_up, x, p, tiles, plan, act, k) for p in layers])
        rows.append(("gate/up", tiles, 1, k, 4 * tiles, us))
        print(f"gate/up tiles {tiles} K {k} programs {4 * tiles}: {us:.2f} us", flush=True)
    for tiles, splits, k in down_specs:
        y = torch.empty(splits, TOP_K, tiles * BLOCK_W, device="cuda", dtype=torch.float32)
        us = graph_time_us([partial(down, act, p, tiles, splits, plan, y, topk_w, k) for p in layers])
        rows.append(("down", tiles, splits, k, 4 * tiles * splits, us))
        print(f"down tiles {tiles} splits {splits} K {k} programs {4 * tiles * splits}: {us:.2f} us", flush=True)
    print("\n| GEMM | tiles an expert | K splits | K | programs | µs a layer |")
    print("|---|---|---|---|---|---|")
    for name, tiles, splits, k, programs, us in rows:
        print(f"| {name} | {tiles} | {splits} | {k} | {programs} | {us:.2f} |")


if __name__ == "__main__":
    main()
