"""The one-pass RMSNorm kernels against the reference (TRITON_INTERPRET=1 on CPU)."""

from __future__ import annotations

import pytest
import torch

from osserve.ops.norm import add_rms_norm_reference, rms_norm_reference
from osserve.ops.norm_triton import add_rms_norm_triton


@pytest.mark.parametrize("t", [1, 3, 17])
@pytest.mark.parametrize("h", [64, 100])
def test_norms_match_reference(t: int, h: int) -> None:
    g = torch.Generator().manual_seed(t * h)
    x, res = torch.randn(t, h, generator=g) * 3, torch.randn(t, h, generator=g)
    w = torch.randn(h, generator=g)
    out, summed = add_rms_norm_triton(x, res, w, 1e-5)
    ref_out, ref_sum = add_rms_norm_reference(x, res, w, 1e-5)
    assert torch.allclose(summed, ref_sum) and (out - ref_out).abs().max() < 1e-5
    out, same = add_rms_norm_triton(x, None, w, 1e-5)
    assert same is x or torch.equal(same, x)
    assert (out - rms_norm_reference(x, w, 1e-5)).abs().max() < 1e-5
