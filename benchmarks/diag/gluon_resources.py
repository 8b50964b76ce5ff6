"""Diagnostic: the Gluon MoE kernels' registers, spills and shared memory for sm_90, compiled on a CPU.

fused_moe_gluon runs with CPU tensors under the Hopper policy and each kernel launch is caught before
it reaches a driver (compile_targets.py's way); each distinct Gluon launch is then compiled for sm_90
by Triton's own compiler and the ptxas it ships. Use the device's Triton (3.6) for counts that hold
there. Occupancy: 65,536 registers and 227 KB of shared memory an SM.

    PYTHONPATH=$PWD python3 benchmarks/diag/gluon_resources.py [--tokens 256] [--variants 32:2:3,64:2:3:r] [--sass DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import io
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget

from benchmarks.compile_targets import Launch, bind, caught_launches, resources
from benchmarks.diag.moe_tiles import variant
from osserve.ops.moe.gluon import fused_moe_gluon
from osserve.ops.moe.layout import prepare_mxfp4_experts
from osserve.ops.policy import decide
from tests.ops.moe_fixtures import random_experts

TARGET = GPUTarget("cuda", 90, 32)
H = I = 2880


def record(t: int, num_experts: int, spec: str) -> list[Launch]:
    """fused_moe_gluon's Gluon launches at T tokens (uniform routing) for a moe_tiles.py variant,
    caught before the driver."""
    name, kwargs = variant(spec)
    with caught_launches(decide((9, 0)), 132) as caught:
        prepared = prepare_mxfp4_experts(random_experts(num_experts, H, I), fragments=True)
        ids = torch.stack([torch.randperm(num_experts)[:4] for _ in range(t)])
        weights = torch.full((t, 4), 0.25, dtype=torch.bfloat16)
        kwargs.setdefault("ws", False)  # the cp.async K loops, unless the variant asks for the copy warp (:w)
        fused_moe_gluon(torch.zeros(t, H, dtype=torch.bfloat16), weights, ids, prepared, 7.0, **kwargs)
    return [Launch(f"T={t} {name}", fn, args, kw) for fn, args, kw in caught if fn.is_gluon()]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--variants", default="32:2:3,64:2:3,64:2:3:r",
                        help="moe_tiles.py's variants: token tile:gate/up tiles:ring depth, then optionally :r "
                             "(ragged tiles), :w (the copy-warp K loop), :gN / :dN (gate/up / down register caps), "
                             "comma separated")
    parser.add_argument("--sass", default=None, help="write each kernel's cubin into this folder")
    args = parser.parse_args()
    print(f"Triton {triton.__version__}, target sm_90")
    for spec in args.variants.split(","):
        for launch in record(args.tokens, args.experts, spec):
            src, options, _ = bind(launch, TARGET)
            with contextlib.redirect_stdout(io.StringIO()):
                kernel = triton.compile(src, target=TARGET, options=options)
            registers, spilled = resources(kernel.asm["cubin"], kernel.metadata.name)
            warps = kernel.metadata.num_warps  # with the copy warp (:w), the warp-specialized total (8)
            by_regs = 65536 // (max(registers, 1) * 32 * warps)
            by_smem = (227 * 1024) // max(kernel.metadata.shared, 1)
            print(f"{launch.scenario:>24} {launch.fn.__name__:>16}: {registers} registers, {spilled} B spilled, "
                  f"{kernel.metadata.shared} B shared; {min(by_regs, by_smem)} programs an SM "
                  f"(registers {by_regs}, shared {by_smem})")
            if args.sass:
                Path(args.sass).mkdir(parents=True, exist_ok=True)
                name = f"{launch.fn.__name__}-{spec.replace(':', '-')}.cubin"
                (Path(args.sass) / name).write_bytes(kernel.asm["cubin"])


if __name__ == "__main__":
    main()
