"""Where the batch-1 Gluon MoE's time goes: its two kernels' times as their K steps and their grids
change (the expert shapes H x I scaled around gpt-oss's 2,880 x 2,880; 32 experts, top 4, one token).

Run on the GPU: PYTHONPATH=$PWD python3 benchmarks/diag/moe_scaling.py
Per shape: the layer's time from a CUDA-graph replay over LAYERS layers with distinct weights, and
each kernel's eager time (PyTorch profiler). The fixed cost and the cost per K step follow from the
rows with the same grid; the rows with the same steps show what more programs per SM cost.
"""
from __future__ import annotations

from functools import partial

import torch

from benchmarks.bench_moe import graph_time_us
from benchmarks.bench_moe_decode import kernel_times
from osserve.ops.moe.gluon import fused_moe_gluon
from osserve.ops.moe.layout import prepare_mxfp4_experts
from tests.ops.moe_fixtures import random_experts, random_routing

LIMIT, E, LAYERS = 7.0, 32, 8
SHAPES = ((2880, 2880), (1408, 2880), (5760, 2880), (2880, 1408), (2880, 5760), (2880, 704))


def main() -> None:
    rows = []
    for h, i in SHAPES:
        torch.manual_seed(0)
        prepared = []
        for _ in range(LAYERS):
            e = random_experts(E, h, i, device="cuda")
            prepared.append(prepare_mxfp4_experts(e, fragments=True))
            del e
        x = torch.randn(1, h, device="cuda").bfloat16()
        fns = []
        for p in prepared:
            w, ids = random_routing(1, E, 4, device="cuda")
            fns.append(partial(fused_moe_gluon, x, w.bfloat16(), ids, p, LIMIT))
        g = graph_time_us(fns)
        k = kernel_times(fns, rounds=10)
        gu = next(v for n, v in k.items() if "gate_up" in n)
        dn = next(v for n, v in k.items() if "down" in n)
        rows.append((h, i, g, gu, dn))
        print(f"H={h} I={i}: graph {g:.1f} us/layer; kernels " + "; ".join(f"{n} {v:.1f}" for n, v in k.items()),
              flush=True)
        del prepared, fns
        torch.cuda.empty_cache()
    # K steps of the whole K (a split program takes its share) and 64-row tiles of the four experts hit.
    print("\n   H     I  gu_K_steps gu_tiles  down_K_steps down_tiles  graph  gate/up  down")
    for h, i, g, gu, dn in rows:
        print(f"{h:5d} {i:5d} {-(-h // 128):11d} {4 * (2 * i // 64):8d} {-(-i // 128):13d} {4 * (h // 64):10d} "
              f"{g:6.1f} {gu:8.1f} {dn:5.1f}")


if __name__ == "__main__":
    main()
