"""Linear layers of the dense part of the model (attention projections, lm_head): the small-M
Triton kernel at decode sizes on a GPU, cuBLAS (F.linear) for larger batches and elsewhere; and
the head's float32 logits (linear_float32)."""

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


def linear_float32(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """F.linear(x, weight) in float32 for bf16 x [T, K], weight [N, K]: on a GPU cuBLAS writes its
    float32 sums as they are. Rounded to bf16 first (F.linear, then widened), logits ~10 apart by
    less than bf16's step there (1/16) tie, and greedy picks among ties where the float32 logits
    had one best (the small-batch head kernel, ops/linear/head_triton.py, keeps float32 too).
    Speculative steps' verified rows take these: on the tiny checkpoint their greedy tokens were the
    float32 model's argmax 0.5-2.1 points less often than plain decoding's with rounded logits, and
    2.0 less to 0.3 more without (16 prompts x 40 tokens, two seeds, chain and tree; H100,
    2026-11-27, benchmarks/diag/spec_agreement.py)."""
    if use_triton(x) and x.dtype == torch.bfloat16 and weight.dtype == torch.bfloat16:
        return torch.mm(x, weight.t(), out_dtype=torch.float32)
    return F.linear(x, weight).float()
