"""Hardware counters for the decode kernels: runs one case a few times, eagerly, for Nsight Compute
to read. Timings come from the graph-replay benches (bench_moe_gluon.py, bench_linear.py); this
script only gives ncu something to profile.

Run on the GPU through benchmarks/ncu_run.sh, or by hand (one case per process; ncu replays each
profiled kernel once per counter pass):
    ncu --clock-control none -k regex:'_gate_up_kernel|_down_kernel' --launch-skip 2 --launch-count 2 \
        --set full python3 benchmarks/ncu_kernels.py moe 120b 256
    ncu ... -k regex:_small_m_linear_kernel python3 benchmarks/ncu_kernels.py linear o 1
Cases: `moe MODEL T [--variant SPEC]` (one layer of random experts, uniform routing: gate/up then down),
`linear qkv|o|lm_head T` (the small-M projection at gpt-oss's shapes; o split in two as at decode).
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.bench_moe_decode import HIDDEN, INTER, LIMIT, MODELS, timing_inputs
from benchmarks.diag.moe_tiles import variant
from osserve.ops.linear.small_m_triton import small_m_linear_triton, unreduced_splits
from osserve.ops.moe.gluon import fused_moe_gluon
from osserve.ops.moe.layout import prepare_mxfp4_experts
from tests.ops.moe_fixtures import random_experts

LINEAR_SHAPES = {"qkv": (5120, 2880), "o": (2880, 4096), "lm_head": (201088, 2880)}
CALLS = 3  # the first compiles; ncu's --launch-skip leaves it out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=("moe", "linear"))
    parser.add_argument("shape", help="moe: 20b or 120b; linear: qkv, o or lm_head")
    parser.add_argument("tokens", type=int)
    parser.add_argument("--variant", default=None,
                        help="moe: a diag/moe_tiles.py variant (e.g. 16:1:4:w) instead of the default launch")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.kind == "moe":
        num_experts = MODELS[args.shape][0]
        prepared = prepare_mxfp4_experts(random_experts(num_experts, HIDDEN, INTER, device="cuda"), fragments=True)
        x, w, ids, hit = timing_inputs(args.tokens, num_experts)
        kwargs = variant(args.variant)[1] if args.variant else {}
        print(f"moe {args.shape} T={args.tokens}: {hit} experts hit; {kwargs or 'the default launch'}", flush=True)
        for _ in range(CALLS):
            fused_moe_gluon(x, w, ids, prepared, LIMIT, **kwargs)
    else:
        n, k = LINEAR_SHAPES[args.shape]
        weight = torch.randn(n, k, device="cuda").bfloat16()
        x = torch.randn(args.tokens, k, device="cuda").bfloat16()
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        splits = unreduced_splits(n, k, sms) if args.shape == "o" else 1
        print(f"linear {args.shape} [{n}, {k}] T={args.tokens}: {splits} K splits", flush=True)
        for _ in range(CALLS):
            small_m_linear_triton(x, weight, None, splits=splits)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
