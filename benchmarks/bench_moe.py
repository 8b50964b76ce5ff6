"""The token-tiled MXFP4 MoE kernel (ops/moe/tiled.py, the portable large-batch path) vs the
dequantised-bf16 per-expert torch loop (the reference), at gpt-oss-20b and -120b shapes.

Run on the GPU: PYTHONPATH=$PWD python3 benchmarks/bench_moe.py [--sweep]
Triton times are CUDA-graph replays of L layers in a row (distinct weights per layer so L2 can't
hold them), divided by L; the torch loop syncs on the host (torch.unique), so it is timed eagerly.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial

import torch
from triton.testing import do_bench

from osserve.ops.moe.layout import prepare_mxfp4_experts
from osserve.ops.moe.reference import moe_reference
from osserve.ops.moe.tiled import CONFIGS, MoEConfig, fused_moe_triton, pick_config
from tests.ops.moe_fixtures import random_experts, random_routing

HIDDEN = INTER = 2880
TOP_K, LIMIT = 4, 7.0
TOKENS = (1, 8, 32, 64, 256, 2048, 8192)
MODELS = {"20b": (32, 4), "120b": (128, 2)}  # experts, layers rotated
EXPERT_PARAMS = 2 * INTER * HIDDEN + HIDDEN * INTER
EXPERT_BYTES = EXPERT_PARAMS // 2 + EXPERT_PARAMS // 32  # nibbles + E8M0 scales (biases aside)


def graph_time_us(fns: list) -> float:
    """Median time of one call, from a CUDA graph replaying all of `fns` once."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in fns:
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fns:
            fn()
    ms = do_bench(graph.replay, warmup=25, rep=100, return_mode="median")
    return ms * 1e3 / len(fns)


def sweep(
    prepared: list, num_experts: int, candidates: list[tuple[MoEConfig, bool]], tokens: tuple[int, ...]
) -> None:
    for t in tokens:
        x = torch.randn(t, HIDDEN, device="cuda").bfloat16()
        w, ids = random_routing(t, num_experts, TOP_K, device="cuda")
        w = w.bfloat16()
        for cfg, fast in candidates:
            us = graph_time_us([partial(fused_moe_triton, x, w, ids, p, LIMIT, cfg, fast) for p in prepared])
            print(f"sweep T={t:5d} fast={fast:d} {cfg}: {us:9.1f} us", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sweep", action="store_true", help="time candidate configs first")
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    print(f"GPU {props.name}, {props.multi_processor_count} SMs; torch {torch.__version__}; "
          f"expert {EXPERT_BYTES / 1e6:.2f} MB MXFP4; 20b layer {32 * EXPERT_BYTES / 1e6:.0f} MB, "
          f"120b layer {128 * EXPERT_BYTES / 1e6:.0f} MB; configs {CONFIGS}", flush=True)
    rows = []
    for model, (num_experts, layers) in MODELS.items():
        originals = [random_experts(num_experts, HIDDEN, INTER, device="cuda") for _ in range(layers)]
        prepared = [prepare_mxfp4_experts(e) for e in originals]
        ref_layer = originals[0]
        for e in originals[1:]:
            e.gate_up_blocks = e.gate_up_scales = e.down_blocks = e.down_scales = None
        torch.cuda.empty_cache()
        if args.sweep and model == "20b":
            sweep(prepared, num_experts, SWEEP_DECODE, (1, 32))
            sweep(prepared, num_experts, SWEEP_MID, (256,))
            sweep(prepared, num_experts, SWEEP_PREFILL, (2048,))
        for t in TOKENS:
            x = torch.randn(t, HIDDEN, device="cuda").bfloat16()
            w, ids = random_routing(t, num_experts, TOP_K, device="cuda")
            w = w.bfloat16()
            out = fused_moe_triton(x, w, ids, prepared[0], LIMIT)
            ref = moe_reference(x, w, ids, ref_layer, LIMIT)
            err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
            tri = graph_time_us([partial(fused_moe_triton, x, w, ids, p, LIMIT) for p in prepared])
            torch_us = do_bench(partial(moe_reference, x, w, ids, ref_layer, LIMIT), warmup=10, rep=50,
                                return_mode="median") * 1e3
            hit = torch.unique(ids).numel()
            gbs = hit * EXPERT_BYTES / (tri * 1e-6) / 1e9
            tflops = 2 * t * TOP_K * EXPERT_PARAMS / (tri * 1e-6) / 1e12
            rows.append((model, t, hit, tri, torch_us, gbs, tflops, err, pick_config(t).block_m))
            print(rows[-1], flush=True)
        originals = prepared = []
        ref_layer = None
        torch.cuda.empty_cache()
    print("\nmodel     T  experts_hit  triton_us  torch_bf16_us  speedup  weight_GB/s  TFLOP/s  rel_err  BM")
    for model, t, hit, tri, tor, gbs, tfl, err, bm in rows:
        print(f"{model:>5} {t:5d} {hit:12d} {tri:10.1f} {tor:14.1f} {tor / tri:8.2f} {gbs:12.0f} "
              f"{tfl:8.1f} {err:8.1e} {bm:3d}")
    sys.stdout.flush()


_D1 = MoEConfig(16, 32, 128, 4, 4, 32, 128, 4, 4)
_D3 = MoEConfig(16, 64, 128, 4, 3, 64, 128, 4, 3)
_P2 = MoEConfig(128, 64, 64, 8, 3, 128, 64, 8, 3)
SWEEP_DECODE = [(_D1, False), (_D1, True), (_D3, True), (MoEConfig(16, 32, 256, 4, 3, 32, 256, 4, 3), True),
                (MoEConfig(16, 16, 256, 4, 3, 16, 256, 4, 3), True)]
SWEEP_MID = [(MoEConfig(32, 64, 128, 4, 3, 64, 128, 4, 3), True),
             (MoEConfig(64, 64, 64, 4, 3, 64, 64, 4, 3), True)]
SWEEP_PREFILL = [(_P2, False), (_P2, True), (MoEConfig(128, 64, 128, 8, 3, 128, 128, 8, 3), True),
                 (MoEConfig(128, 32, 64, 4, 4, 64, 64, 4, 4), True)]

if __name__ == "__main__":
    main()
