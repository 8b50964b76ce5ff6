"""The portable path compiles for an A10 (sm_86) without one: benchmarks/compile_targets.py, in a process
of its own (the interpreter this suite runs under replaces the kernels it compiles), through Triton's
compiler and bundled ptxas with an explicit GPUTarget. Every Triton kernel under osserve/ops (the Gluon
ones aside) compiles at each config the portable policy launches, within a block's 99 KB of shared
memory; and, as a control, the Hopper policy's PDL and packed-dequantiser launches compile for sm_90
and are rejected by ptxas for sm_86, so the check does see sm_90-only PTX. sm_80 and sm_89: the same
script with --targets (README's table)."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import osserve.ops

ROOT = Path(__file__).parents[2]
A10_SHARED = 101_376


def triton_kernels() -> set[str]:
    """The names of the launched (`*_kernel`) Triton functions defined under osserve/ops, the Gluon modules aside."""
    names = set()
    for info in pkgutil.walk_packages(osserve.ops.__path__, "osserve.ops."):
        if "gluon" in info.name:
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            kind = type(obj).__name__
            if name.endswith("_kernel") and kind in ("JITFunction", "InterpretedFunction") \
                    and getattr(obj, "__module__", info.name) == info.name:
                names.add(name)
    return names


def test_every_portable_kernel_compiles_for_sm_86_and_fits(tmp_path: Path) -> None:
    out = tmp_path / "compiled.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "benchmarks/compile_targets.py", "--targets", "sm_86", "--control",
         "--control-scenarios", "sm90-pieces", "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(out.read_text())
    portable = results["portable"]
    assert all(r["ok"] and r["target"] == "sm_86" for r in portable), [r for r in portable if not r["ok"]]
    assert all(0 < r["registers"] <= 255 and r["shared"] <= A10_SHARED == r["shared_limit"] for r in portable)
    assert triton_kernels() <= {r["kernel"] for r in portable}, triton_kernels() - {r["kernel"] for r in portable}
    assert not any("PDL=1" in r["config"] or "FAST=1" in r["config"] for r in portable)

    hopper = results["hopper"]
    assert all(r["ok"] for r in hopper if r["target"] == "sm_90")
    rejected = {r["kernel"]: r["error"] for r in hopper if r["target"] == "sm_86" and not r["ok"]}
    assert "requires .target sm_90" in rejected["_add_rms_norm_kernel"]  # griddepcontrol.wait
    assert "mul.bf16x2" in rejected["_gate_up_swapped_kernel"] and "mul.bf16x2" in rejected["_down_swapped_kernel"]
    assert all("requires .target sm_90" in error for error in rejected.values())
