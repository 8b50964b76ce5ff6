"""The weights-as-left-operand MoE kernel (moe/swapped.py) against moe_reference, in float32 under
TRITON_INTERPRET=1 on CPU: routings with empty and overloaded experts, K masks, N masks, and the
split-K path (partial sums, the SwiGLU reduction kernel, a last split shorter than the others)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from osserve.ops.moe import plan as moe_align
from osserve.ops.moe import swapped as moe_swapped
from osserve.ops.moe.layout import prepare_mxfp4_experts
from osserve.ops.moe.reference import moe_reference
from osserve.ops.moe.swapped import SwappedConfig, fused_moe_swapped, split_k
from osserve.ops.norm.norm_triton import add_rms_norm_triton
from tests.ops.moe_fixtures import poison_fresh_buffers, random_experts, random_routing

LIMIT = 7.0
SMALL = SwappedConfig(16, 16, 64, 4, 1, 32, 64, 4, 1)
WIDE = SwappedConfig(32, 64, 128, 4, 1, 128, 32, 4, 1)  # BLOCK_W > N, BLOCK_K > K: the masks
NO_SPLIT, MAX_SPLIT = 1, 10**6  # min_programs


@pytest.fixture(autouse=True)
def poison(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every fresh buffer the kernels allocate starts as NaN / garbage, so unwritten entries show."""
    poison_fresh_buffers(monkeypatch, moe_swapped, moe_align)


def _check(num_tokens: int, num_experts: int, top_k: int, hidden: int, inter: int, mode: str,
           config: SwappedConfig, min_programs: int) -> None:
    experts = random_experts(num_experts, hidden, inter)
    x = torch.randn(num_tokens, hidden)
    weights, ids = random_routing(num_tokens, num_experts, top_k, mode)
    ref = moe_reference(x, weights, ids, experts, LIMIT)
    out = fused_moe_swapped(x, weights, ids, prepare_mxfp4_experts(experts), LIMIT, config, min_programs)
    assert out.shape == ref.shape and torch.isfinite(out).all()
    err = (out - ref).norm() / ref.norm()
    assert err < 1e-4, f"relative error {err:.2e}"


@pytest.mark.parametrize("min_programs", [NO_SPLIT, MAX_SPLIT], ids=["whole-k", "split-k"])
@pytest.mark.parametrize("num_tokens,mode", [(1, "uniform"), (2, "uniform"), (7, "sparse"), (33, "skewed")])
def test_matches_reference(num_tokens: int, mode: str, min_programs: int) -> None:
    # H=160, I=96: K = 2.5 and 1.5 steps of 64, so the last split is a half step.
    _check(num_tokens, 8, 4, 160, 96, mode, SMALL, min_programs)


@pytest.mark.parametrize("min_programs", [NO_SPLIT, MAX_SPLIT], ids=["whole-k", "split-k"])
def test_masks(min_programs: int) -> None:
    _check(7, 6, 3, 96, 32, "uniform", WIDE, min_programs)


@pytest.mark.parametrize("min_programs", [NO_SPLIT, MAX_SPLIT], ids=["whole-k", "split-k"])
def test_unreduced_output_sums_in_the_norm(min_programs: int) -> None:
    """reduce=False leaves [S, T, k, H] for add_rms_norm to sum: the same residual and norm, bit for
    bit, as summing in the MoE (both add splits outer, experts inner, in float32)."""
    experts = random_experts(8, 160, 96)
    prepared = prepare_mxfp4_experts(experts)
    x, res, w = torch.randn(7, 160), torch.randn(7, 160), torch.randn(160)
    weights, ids = random_routing(7, 8, 4, "uniform")
    summed = fused_moe_swapped(x, weights, ids, prepared, LIMIT, SMALL, min_programs)
    parts = fused_moe_swapped(x, weights, ids, prepared, LIMIT, SMALL, min_programs, reduce=False)
    assert parts.dim() == 4 and parts.shape[1:] == (7, 4, 160) and (parts.shape[0] > 1) == (min_programs > 1)
    out, new_res = add_rms_norm_triton(parts, res, w, 1e-5)
    ref_out, ref_res = add_rms_norm_triton(summed, res, w, 1e-5)
    assert torch.equal(new_res, ref_res) and torch.equal(out, ref_out)


def test_split_k_counts() -> None:
    assert split_k(num_programs=180, k=2880, block_k=128, min_programs=528) == (3, 1024)
    assert split_k(num_programs=1440, k=2880, block_k=128, min_programs=528) == (1, 2944)
    assert split_k(num_programs=1, k=2880, block_k=128, min_programs=10**6) == (23, 128)  # one step each
    splits, per_split = split_k(num_programs=100, k=2880, block_k=128, min_programs=700)  # 7 asked
    assert per_split % 128 == 0 and (splits - 1) * per_split < 2880 <= splits * per_split


def test_scales_group_major_and_row_major_agree() -> None:
    """prepare_mxfp4_experts stores the scales group-major (rows fastest); the kernels read them
    through strides, so the row-major copy of the same scales gives the same output."""
    experts = random_experts(8, 160, 96)
    prepared = prepare_mxfp4_experts(experts)
    assert prepared.s1.stride(1) == 1 and prepared.s1.stride(2) == prepared.s1.shape[1]
    assert prepared.s2.stride(1) == 1 and prepared.s2.stride(2) == prepared.s2.shape[1]
    row_major = replace(prepared, s1=prepared.s1.contiguous(), s2=prepared.s2.contiguous())
    assert torch.equal(row_major.s1, prepared.s1) and row_major.s1.stride(2) == 1
    x = torch.randn(7, 160)
    weights, ids = random_routing(7, 8, 4, "uniform")
    for min_programs in (NO_SPLIT, MAX_SPLIT):
        out = fused_moe_swapped(x, weights, ids, prepared, LIMIT, SMALL, min_programs)
        assert torch.equal(out, fused_moe_swapped(x, weights, ids, row_major, LIMIT, SMALL, min_programs))
