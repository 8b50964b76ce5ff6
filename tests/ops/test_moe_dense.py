"""The dense prefill MoE path and its one-pass dequantisation (TRITON_INTERPRET=1 on CPU)."""

from __future__ import annotations

import pytest
import torch

from osserve.ops.moe.reference import moe_reference
from tests.ops.moe_fixtures import random_experts, random_routing


def test_triton_dequant_of_a_whole_layer() -> None:
    from osserve.ops.moe.dense import dequantize_mxfp4_triton
    from osserve.ops.mxfp4.reference import dequantize_mxfp4

    torch.manual_seed(5)
    ex = random_experts(4, 64, 64)
    assert torch.equal(dequantize_mxfp4_triton(ex.gate_up_blocks, ex.gate_up_scales, torch.float32),
                       dequantize_mxfp4(ex.gate_up_blocks, ex.gate_up_scales))
    assert torch.equal(dequantize_mxfp4_triton(ex.down_blocks, ex.down_scales, torch.bfloat16),
                       dequantize_mxfp4(ex.down_blocks, ex.down_scales, torch.bfloat16))


@pytest.mark.parametrize("mode", ["uniform", "skewed", "sparse"])
def test_dense_prefill_path_matches_reference(mode: str) -> None:
    """Float32: the grouped GEMMs over rows sorted by expert are moe_reference up to summation
    order, with experts that get every token (skewed), none (sparse) and one token (T=1)."""
    from osserve.ops.moe.dense import moe_prefill_dense

    torch.manual_seed(5)
    ex = random_experts(6, 64, 96)
    for t in (1, 40):
        x = torch.randn(t, 64)
        w, ids = random_routing(t, 6, 2, mode)
        ref = moe_reference(x, w, ids, ex, 7.0)
        assert ((moe_prefill_dense(x, w, ids, ex, 7.0) - ref).norm() / ref.norm()).item() < 1e-5, (mode, t)


def test_dense_prefill_path_in_bf16_and_empty() -> None:
    """bf16 as served, with int32 expert ids: within bf16 rounding of the float32 reference; no tokens, no rows."""
    from osserve.ops.moe.dense import moe_prefill_dense

    torch.manual_seed(8)
    ex = random_experts(4, 64, 64)
    x = torch.randn(24, 64)
    w, ids = random_routing(24, 4, 2, "uniform")
    ref = moe_reference(x, w, ids, ex, 7.0)
    out = moe_prefill_dense(x.bfloat16(), w.bfloat16(), ids.int(), ex, 7.0)
    assert out.dtype == torch.bfloat16
    assert ((out.float() - ref).norm() / ref.norm()).item() < 2e-2
    assert moe_prefill_dense(x[:0].bfloat16(), w[:0].bfloat16(), ids[:0], ex, 7.0).shape == (0, 64)


def test_expert_loop_matches_grouped_mm() -> None:
    """The loop a float32 model on a GPU takes (CUTLASS's grouped GEMM is bf16 only) gives
    torch._grouped_mm's rows, with an expert of no rows between two of some."""
    from osserve.ops.moe.dense import expert_loop_mm, grouped_mm

    torch.manual_seed(9)
    rows, weights = torch.randn(10, 32), torch.randn(3, 48, 32)
    ends = torch.tensor([4, 4, 10], dtype=torch.int32)
    loop = expert_loop_mm(rows, weights, ends)
    torch.testing.assert_close(loop, grouped_mm(rows, weights, ends))
    torch.testing.assert_close(loop[4:], rows[4:] @ weights[2].t())


def test_swiglu_kernel_matches_reference() -> None:
    """Interleaved gate/up [N, 2I] + each row's expert bias -> [N, I] with I not a multiple of the
    kernel's block, written into rows of a wider buffer; values past the limit on both sides."""
    from osserve.ops.moe.dense import swiglu_into
    from osserve.ops.moe.reference import swiglu

    torch.manual_seed(6)
    h = torch.randn(5, 2 * 1100) * 6
    bias = torch.randn(3, 2 * 1100)
    expert = torch.tensor([2, 0, 2, 1, 0])
    out = torch.full((7, 1100), float("nan"))
    swiglu_into(h, bias, expert, out[1:6], 7.0)
    torch.testing.assert_close(out[1:6], swiglu(h + bias[expert], 7.0), rtol=1e-5, atol=1e-5)
    assert out[0].isnan().all() and out[6].isnan().all()


def test_dense_path_only_where_its_dequantisation_repays() -> None:
    """Above the fused kernels' range (4,096 tokens), the Gluon kernel in chunks keeps a batch until
    its experts average DENSE_MIN_ROWS_PER_EXPERT rows: the 20b's 32 experts (top 4) do from 2,560
    tokens, so its batches there all go dense; the 120b's 128 from 10,240. Without the Gluon kernel
    the dense path takes every batch above 512."""
    from osserve.ops.moe.dispatch import DENSE_MIN_ROWS_PER_EXPERT, dense_repays

    assert DENSE_MIN_ROWS_PER_EXPERT == 320
    assert dense_repays(4097, 4, 32, gluon=True)
    assert not dense_repays(8192, 4, 128, gluon=True)
    assert not dense_repays(10239, 4, 128, gluon=True)
    assert dense_repays(10240, 4, 128, gluon=True)
    assert dense_repays(4097, 4, 128, gluon=False)
    assert not dense_repays(512, 4, 1, gluon=False)
