"""Diagnostic: the Gluon MoE kernels' registers, spills and shared memory for sm_90, compiled on a CPU.

fused_moe_gluon runs with CPU tensors under the Hopper policy and each kernel launch is caught before
it reaches a driver (compile_targets.py's way); each distinct Gluon launch is then compiled for sm_90
by Triton's own compiler and the ptxas it ships. Use the device's Triton (3.6) for counts that hold
there. Occupancy: 65,536 registers and 227 KB of shared memory an SM.

    PYTHONPATH=$PWD python3 benchmarks/diag/gluon_resources.py [--tokens 256] [--variants 32:2,64:2] [--sass DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import io
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import JITFunction

from benchmarks.compile_targets import Launch, bind, resources
from osserve.ops.moe.gluon import fused_moe_gluon
from osserve.ops.moe.layout import prepare_mxfp4_experts
from osserve.ops.policy import decide, use_policy
from tests.ops.moe_fixtures import random_experts

TARGET = GPUTarget("cuda", 90, 32)
H = I = 2880


def record(t: int, block_t: int, tiles: int, num_experts: int, extra: dict[str, Any]) -> list[Launch]:
    """fused_moe_gluon's Gluon launches at T tokens (uniform routing), caught before the driver."""
    launches: list[Launch] = []
    original, properties = JITFunction.run, torch.cuda.get_device_properties

    def catch(self: JITFunction, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        launches.append(Launch(f"T={t} bt={block_t} x{tiles}{' ragged' * bool(extra.get('ragged'))}"
                               f"{' caps ' + str(extra['max_registers']) if 'max_registers' in extra else ''}", self,
                               args, kwargs))

    JITFunction.run = catch  # type: ignore[method-assign]
    torch.cuda.get_device_properties = lambda *_: SimpleNamespace(multi_processor_count=132)  # type: ignore[assignment]
    try:
        torch.manual_seed(0)
        prepared = prepare_mxfp4_experts(random_experts(num_experts, H, I), fragments=True)
        ids = torch.stack([torch.randperm(num_experts)[:4] for _ in range(t)])
        weights = torch.full((t, 4), 0.25, dtype=torch.bfloat16)
        with use_policy(decide((9, 0))), torch.inference_mode():
            fused_moe_gluon(torch.zeros(t, H, dtype=torch.bfloat16), weights, ids, prepared, 7.0, block_t,
                            gate_up_tiles=tiles, ws=False, **extra)
    finally:
        JITFunction.run = original  # type: ignore[method-assign]
        torch.cuda.get_device_properties = properties
    return [launch for launch in launches if "gluon" in type(launch.fn).__module__]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--variants", default="32:2,64:2,64:2:r",
                        help="token tile:gate/up tiles, then optionally :r (ragged tiles), :gN / :dN (gate/up / "
                             "down register caps), comma separated")
    parser.add_argument("--sass", default=None, help="write each kernel's SASS into this folder")
    args = parser.parse_args()
    print(f"Triton {triton.__version__}, target sm_90")
    for variant in args.variants.split(","):
        block_t, tiles, *flags = variant.split(":")
        extra: dict[str, Any] = {"ragged": "r" in flags}
        caps = {f[0]: int(f[1:]) for f in flags if f[0] in "gd"}
        if caps:
            extra["max_registers"] = (caps.get("g"), caps.get("d"))
        for launch in record(args.tokens, int(block_t), int(tiles), args.experts, extra):
            src, options, _ = bind(launch, TARGET)
            src = GluonASTSource(src.fn, src.signature, {k: v for k, v in src.constants.items()}, src.attrs)
            with contextlib.redirect_stdout(io.StringIO()):
                kernel = triton.compile(src, target=TARGET, options=options)
            registers, spilled = resources(kernel.asm["cubin"], kernel.metadata.name)
            warps = options.get("num_warps", 4)
            by_regs = 65536 // (max(registers, 1) * 32 * warps)
            by_smem = (227 * 1024) // max(kernel.metadata.shared, 1)
            print(f"{launch.scenario:>18} {launch.fn.__name__:>16}: {registers} registers, {spilled} B spilled, "
                  f"{kernel.metadata.shared} B shared; {min(by_regs, by_smem)} programs an SM "
                  f"(registers {by_regs}, shared {by_smem})")
            if args.sass:
                Path(args.sass).mkdir(parents=True, exist_ok=True)
                name = f"{launch.fn.__name__}-{variant.replace(':', '-')}.cubin"
                (Path(args.sass) / name).write_bytes(kernel.asm["cubin"])


if __name__ == "__main__":
    main()
