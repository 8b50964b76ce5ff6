"""The FP8 decode kernel of sm_90 (ops/attention/fp8_decode_gluon.py) without a GPU: it is Gluon, which
the interpreter does not run, so here it is compiled for sm_90 by Triton's compiler and ptxas
(benchmarks/diag/fp8_decode_sass.py, in a process without TRITON_INTERPRET) and its design checked on
the result: no shared memory, no spills, registers for eight programs an SM, and each 32-key trip
reading its codes with four 16-byte and eight 8-byte loads. What it computes is checked on the GPU
(tests/gpu/test_kv_fp8_gpu.py: against the reference and against the Triton kernel). Also its launch
choices, which are plain Python."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from osserve.ops.attention.decode_triton import gluon_num_splits
from osserve.ops.attention.fp8_decode_gluon import supported
from osserve.ops.policy import decide, use_policy

ROOT = Path(__file__).parents[2]


def test_splits_fill_about_one_wave() -> None:
    # 132 SMs, 10 one-warp programs each: 1,320 programs a wave
    assert gluon_num_splits(256, 8, 2048, 132) == 1  # 2,048 programs
    assert gluon_num_splits(128, 8, 8192, 132) == 1  # 1,024: a second split would make two waves
    assert gluon_num_splits(32, 8, 8192, 132) == 4  # 256 programs: 5 a sequence, rounded down to 4
    assert gluon_num_splits(8, 8, 4096, 132) == 16  # by length: at least 256 keys a split
    assert gluon_num_splits(1, 8, 100, 132) == 1
    assert gluon_num_splits(1, 8, 1 << 20, 132) == 64  # at most MAX_SPLITS


def test_takes_gpt_oss_shapes_on_hopper_only() -> None:
    cuda = torch.device("cuda", 0)
    with use_policy(decide((9, 0))):
        assert supported(cuda, 64, 16, 8)
        assert not supported(cuda, 128, 16, 8)  # head_dim
        assert not supported(cuda, 64, 32, 8)  # block size
        assert not supported(cuda, 64, 16, 32)  # a GQA group of 32 heads
        assert not supported(torch.device("cpu"), 64, 16, 8)
    with use_policy(decide((8, 9))):  # an L4: the Triton kernel reads its FP8 cache
        assert not supported(cuda, 64, 16, 8)


def test_compiles_for_sm_90_into_registers_only(tmp_path: Path) -> None:
    out = tmp_path / "sass.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"PYTHONPATH": str(ROOT)}
    for window in ([], ["--window", "128"]):
        done = subprocess.run([sys.executable, "benchmarks/diag/fp8_decode_sass.py", "--splits", "1", "4",
                               "--json", str(out), *window], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        for r in json.loads(out.read_text()):
            assert r["shared"] == 0 and r["spilled"] == 0, r
            assert r["registers"] <= 65536 // (32 * 8), r
            ops = r["loop_opcodes"]
            assert ops.get("LDG.E.128") == 4 and ops.get("LDG.E.64") == 8, ops
            assert ops.get("HMMA.16816.F32") == 32, ops  # 16 for the scores, 16 for p @ V
            assert not any(op.startswith(("LDS", "STS", "BAR")) for op in ops), ops
