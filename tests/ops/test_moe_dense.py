"""The dense prefill MoE path and its one-pass dequantisation (TRITON_INTERPRET=1 on CPU)."""

from __future__ import annotations

import torch

from osserve.ops.moe.reference import moe_reference
from tests.ops.moe_fixtures import random_experts, random_routing


def test_triton_dequant_and_dense_prefill_path() -> None:
    from osserve.ops.moe.dense import dequantize_mxfp4_triton, moe_prefill_dense
    from osserve.ops.mxfp4.reference import dequantize_mxfp4

    torch.manual_seed(5)
    ex = random_experts(4, 64, 64)
    assert torch.equal(dequantize_mxfp4_triton(ex.gate_up_blocks, ex.gate_up_scales, torch.float32),
                       dequantize_mxfp4(ex.gate_up_blocks, ex.gate_up_scales))
    x = torch.randn(40, 64)
    w, ids = random_routing(40, 4, 2, "skewed")
    ref = moe_reference(x, w, ids, ex, 7.0)
    assert ((moe_prefill_dense(x, w, ids, ex, 7.0) - ref).norm() / ref.norm()).item() < 1e-5


def test_swiglu_kernel_matches_reference() -> None:
    """Interleaved gate/up [N, 2I] + bias -> [N, I] with I not a multiple of the kernel's block,
    written into rows of a wider buffer; values past the limit on both sides."""
    from osserve.ops.moe.dense import swiglu_into
    from osserve.ops.moe.reference import swiglu

    torch.manual_seed(6)
    h = torch.randn(5, 2 * 1100) * 6
    bias = torch.randn(2 * 1100)
    out = torch.full((7, 1100), float("nan"))
    swiglu_into(h, bias, out[1:6], 7.0)
    torch.testing.assert_close(out[1:6], swiglu(h + bias, 7.0), rtol=1e-5, atol=1e-5)
    assert out[0].isnan().all() and out[6].isnan().all()
