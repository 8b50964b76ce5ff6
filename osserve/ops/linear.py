"""Linear layers of the dense part of the model (attention projections, lm_head): the small-M
Triton kernel at decode sizes on a GPU, cuBLAS (F.linear) for larger batches and elsewhere."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from osserve.ops.dispatch import use_triton


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) for x [T, K]."""
    if use_triton(x):
        from osserve.ops.linear_triton import fits_small_m_linear, small_m_linear_triton

        if fits_small_m_linear(x, weight):
            return small_m_linear_triton(x, weight, bias)
    return F.linear(x, weight, bias)
