"""The small-M linear kernel against F.linear (TRITON_INTERPRET=1, CPU, float32): ragged N and K,
1 to 32 rows, with and without bias, every block shape the configs use, a row-strided x."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from osserve.ops.linear.head_triton import ONE_TOKEN_CONFIG
from osserve.ops.linear.small_m_triton import (
    DEFAULT_CONFIG,
    MAX_TOKENS,
    LinearConfig,
    fits_small_m_linear,
    small_m_linear_triton,
    stages_that_fit,
)
from osserve.ops.policy import SHARED_MEMORY_BY_CAPABILITY

CONFIGS = [LinearConfig(16, 32, 4, 2), LinearConfig(64, 64, 4, 3), DEFAULT_CONFIG]


@pytest.mark.parametrize("m", [1, 3, 16, 17, MAX_TOKENS])
@pytest.mark.parametrize(("n", "k"), [(40, 128), (33, 100), (130, 96)])
@pytest.mark.parametrize("config", CONFIGS)
def test_small_m_linear_matches_f_linear(m: int, n: int, k: int, config: LinearConfig) -> None:
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x, w, b = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    for bias in (b, None):
        out = small_m_linear_triton(x, w, bias, config)
        assert out.shape == (m, n) and out.dtype == x.dtype
        assert (out - F.linear(x, w, bias)).abs().max().item() < 1e-4


@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize(("k", "splits", "expected_splits"), [(128, 4, 4), (100, 3, 2), (96, 5, 3)])
def test_k_split_leaves_float32_partials(m: int, k: int, splits: int, expected_splits: int) -> None:
    """splits > 1: [S, M, 1, N] float32 partials of whole 32-column steps (the last one ragged where
    K is), the bias in the first only; their sum is the linear, and add_rms_norm takes them as x."""
    from osserve.ops.norm.norm_triton import add_rms_norm_triton

    g = torch.Generator().manual_seed(m + k)
    x, w, b = torch.randn(m, k, generator=g), torch.randn(40, k, generator=g), torch.randn(40, generator=g)
    parts = small_m_linear_triton(x, w, b, LinearConfig(16, 32, 4, 2), splits=splits)
    assert parts.shape == (expected_splits, m, 1, 40) and parts.dtype == torch.float32
    assert (parts.sum((0, 2)) - F.linear(x, w, b)).abs().max().item() < 1e-4
    k_per_split = math.ceil(math.ceil(k / splits) / 32) * 32
    first = F.linear(x[:, :k_per_split], w[:, :k_per_split], b)
    assert (parts[0, :, 0] - first).abs().max().item() < 1e-4  # split 0: its K range plus the bias
    res, norm_w = torch.randn(m, 40, generator=g), torch.randn(40, generator=g)
    out, summed = add_rms_norm_triton(parts, res, norm_w, 1e-5)
    ref_out, ref_sum = add_rms_norm_triton(F.linear(x, w, b), res, norm_w, 1e-5)
    assert (summed - ref_sum).abs().max().item() < 1e-4 and (out - ref_out).abs().max().item() < 1e-4


def test_small_m_linear_row_strided_x() -> None:
    g = torch.Generator().manual_seed(5)
    wide, w = torch.randn(3, 300, generator=g), torch.randn(24, 96, generator=g)
    x = wide[:, 10:106]
    assert fits_small_m_linear(x, w)
    out = small_m_linear_triton(x, w, None, LinearConfig(16, 32, 4, 2))
    assert (out - F.linear(x, w)).abs().max().item() < 1e-4


def test_what_the_kernel_takes() -> None:
    w = torch.zeros(8, 64)
    assert not fits_small_m_linear(torch.zeros(MAX_TOKENS + 1, 64), w)  # prefill sizes: cuBLAS
    assert not fits_small_m_linear(torch.zeros(4, 64).t(), torch.zeros(8, 4))  # K not contiguous
    assert not fits_small_m_linear(torch.zeros(4, 64, dtype=torch.bfloat16), w)  # dtypes differ
    assert fits_small_m_linear(torch.zeros(MAX_TOKENS, 64), w)


def test_stages_shrink_to_fit_shared_memory() -> None:
    h100, a10 = SHARED_MEMORY_BY_CAPABILITY[(9, 0)], SHARED_MEMORY_BY_CAPABILITY[(8, 6)]
    big = LinearConfig(64, 512, 4, 5)  # (64 + 16) * 512 * 2 bytes = 80 KB a stage, 4 of them in flight at 5
    assert stages_that_fit(big, 16, 2, h100) == 3  # 2 tiles in flight: 160 KB of 227
    assert stages_that_fit(big, 16, 2, a10) == 2  # 1 tile: 80 KB of 99
    assert stages_that_fit(DEFAULT_CONFIG, 16, 2, h100) == DEFAULT_CONFIG.num_stages
    assert stages_that_fit(DEFAULT_CONFIG, 16, 2, a10) == DEFAULT_CONFIG.num_stages  # 4 x 20 KB of 99
    assert stages_that_fit(ONE_TOKEN_CONFIG, 16, 2, h100) == ONE_TOKEN_CONFIG.num_stages == 6
    assert stages_that_fit(ONE_TOKEN_CONFIG, 16, 2, a10) == 4  # 3 x 24 KB of 99 (6 would want 120 KB)
