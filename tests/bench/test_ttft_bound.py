"""benchmarks/diag/ttft_bound.py, the lower bound behind issue 38's 20b TTFT p99 goal: its FLOP count
against a per-position count, and the bound's arithmetic."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from benchmarks.diag.ttft_bound import prompt_flops, ttft_bound
from osserve.config import FULL, preset


@pytest.mark.parametrize("name", ["tiny", "20b", "120b"])
def test_prompt_flops_count_every_position(name: str) -> None:
    cfg = preset(name)
    length = 300  # past the 128-key window, so both layer kinds differ
    f = prompt_flops(cfg, length)
    h, heads, d = cfg.hidden_size, cfg.num_attention_heads, cfg.head_dim
    kv = cfg.num_key_value_heads * d
    dense = expert = attention = 0
    for kind in cfg.layer_types:
        for p in range(length):
            dense += 2 * h * (heads * d + 2 * kv) + 2 * heads * d * h + 2 * h * cfg.num_local_experts
            expert += cfg.num_experts_per_tok * 3 * 2 * h * cfg.intermediate_size
            keys = p + 1 if kind == FULL else min(p + 1, cfg.sliding_window)
            attention += 2 * 2 * heads * d * keys  # q.k over the keys, then p.v
    assert (f.dense, f.experts, f.attention) == (dense, expert, attention)
    assert f.head == 2 * h * cfg.vocab_size
    assert f.total == dense + expert + attention + f.head


def test_bound_is_the_first_waves_tail() -> None:
    # 768 requests, 256 at once: p99 sits between the 248th and 249th prompt of the first wave
    assert ttft_bound(1.0, 256, 768) == pytest.approx(float(np.percentile(list(range(1, 257)) + [0] * 512, 99)))
    assert 248 < ttft_bound(1.0, 256, 768) < 249
    assert ttft_bound(2.0, 256, 768) == pytest.approx(2 * ttft_bound(1.0, 256, 768))
    assert ttft_bound(1.0, 8, 8, pct=100.0) == 8.0  # all at once: the last waits for all eight


def test_script_prints_the_bound_at_given_rates() -> None:
    out = subprocess.run([sys.executable, "benchmarks/diag/ttft_bound.py", "--tflops", "767"],
                         capture_output=True, text=True, check=True, timeout=120).stdout
    assert "a 2 s goal needs 767 TFLOP/s sustained" in out
    assert "| 767 for every part | 767 | 2.00 |" in out
