"""Diagnostic: the FP8 decode kernel of sm_90 (ops/attention/fp8_decode_gluon.py) compiled on a CPU, as
a GPU would run it: registers, spilled bytes, shared memory, and the SASS of its key loop (the
instructions of one 32-key trip by opcode). What its design promises, checked here without a GPU:
no shared memory (the codes go from global memory into MMA operands), no spills, 16-byte loads for
the keys and 8-byte ones for the values. Use the device's Triton (3.6) for counts that hold there.

    PYTHONPATH=$PWD python3 benchmarks/diag/fp8_decode_sass.py [--splits 1] [--window 128] [--json OUT]

Run it without TRITON_INTERPRET (the interpreter replaces the kernels).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget

from benchmarks.compile_targets import Launch, bind, caught_launches, resources
from osserve.ops.attention.fp8_decode_gluon import launch_fp8_decode
from osserve.ops.policy import decide

TARGET = GPUTarget("cuda", 90, 32)
BATCH, HEADS, KV_HEADS, HEAD_DIM, BLOCKS = 256, 64, 8, 64, 4096  # gpt-oss's attention; a small cache


def launch(splits: int, window: int | None) -> Launch:
    """The kernel's launch for `splits` and `window`, caught before it reaches a driver."""
    with caught_launches(decide((9, 0)), 132) as caught:
        q = torch.zeros(BATCH, HEADS, HEAD_DIM, dtype=torch.bfloat16)
        k = torch.zeros(BLOCKS, 16, KV_HEADS, HEAD_DIM, dtype=torch.uint8).view(torch.float8_e4m3fn)
        scales = torch.zeros(BLOCKS, 16, KV_HEADS, dtype=torch.bfloat16)
        partials = torch.empty(BATCH, HEADS, splits, HEAD_DIM), torch.empty(BATCH, HEADS, splits)
        launch_fp8_decode(q, k, k.clone(), scales, scales.clone(), torch.zeros(HEADS, dtype=torch.bfloat16),
                          torch.arange(BATCH + 1, dtype=torch.int32), torch.full((BATCH,), 1000, dtype=torch.int32),
                          torch.zeros(BATCH, 128, dtype=torch.int32), 0.125, window, torch.empty_like(q), splits,
                          partials[0], partials[1], partials[1].clone(), True)
    (fn, args, kwargs), = caught
    return Launch(f"splits={splits} window={window}", fn, args, kwargs)


def loop_opcodes(sass: str) -> collections.Counter[str]:
    """Opcodes of the key loop: the instructions between the label its backward branch targets and
    that branch (the kernel's one loop)."""
    lines = sass.splitlines()
    back = [(i, m.group(1)) for i, line in enumerate(lines) if (m := re.search(r"BRA `\((\.L_x_\d+)\)", line))]
    labels = {line.rstrip(":"): i for i, line in enumerate(lines) if re.fullmatch(r"\.L_x_\d+:", line.strip())}
    start, end = next((labels[label], i) for i, label in back if label in labels and labels[label] < i)
    ops: collections.Counter[str] = collections.Counter()
    for line in lines[start:end + 1]:
        m = re.search(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m:
            ops[m.group(1)] += 1
    return ops


def compile_one(splits: int, window: int | None) -> dict:
    src, options, _ = bind(launch(splits, window), TARGET)
    kernel = triton.compile(src, target=TARGET, options=options)
    registers, spilled = resources(kernel.asm["cubin"], kernel.metadata.name)
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        sass = subprocess.run([str(tool), "-c", f.name], capture_output=True, text=True, check=True).stdout
    ops = loop_opcodes(sass)
    return {"splits": splits, "window": window, "registers": registers, "spilled": spilled,
            "shared": kernel.metadata.shared, "loop_instructions": sum(ops.values()), "loop_opcodes": dict(ops)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--splits", type=int, nargs="*", default=[1, 4])
    ap.add_argument("--window", type=int, default=None, help="a sliding-window layer's (gpt-oss: 128)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    results = [compile_one(splits, args.window) for splits in args.splits]
    for r in results:
        top = ", ".join(f"{op} {n}" for op, n in sorted(r["loop_opcodes"].items(), key=lambda kv: -kv[1])[:12])
        print(f"splits {r['splits']}, window {r['window']}: {r['registers']} registers, {r['spilled']} bytes "
              f"spilled, {r['shared']} bytes of shared memory; the loop: {r['loop_instructions']} instructions ({top})")
    if args.json:
        Path(args.json).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
