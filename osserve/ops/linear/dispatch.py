"""Linear layers of the dense part of the model (attention projections, lm_head): the small-M
Triton kernel at decode sizes on a GPU, cuBLAS (F.linear) for larger batches and elsewhere."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from osserve.ops.dispatch import use_triton


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           reduce: bool = True) -> torch.Tensor:
    """F.linear(x, weight, bias) for x [T, K].

    reduce=False: the result may come unreduced, float32 K-split partials [S, T, 1, N] for
    ops/norm/reference.py's add_rms_norm to sum: at decode sizes the small-M kernel then splits K where the
    weight has fewer row blocks than the GPU has SMs (linear_triton.unreduced_splits)."""
    if use_triton(x):
        from osserve.ops.linear.small_m_triton import fits_small_m_linear, small_m_linear_triton, unreduced_splits

        if fits_small_m_linear(x, weight):
            splits = 1
            if not reduce:
                sms = torch.cuda.get_device_properties(x.device).multi_processor_count
                splits = unreduced_splits(weight.shape[0], weight.shape[1], sms)
            return small_m_linear_triton(x, weight, bias, splits=splits)
    return F.linear(x, weight, bias)
