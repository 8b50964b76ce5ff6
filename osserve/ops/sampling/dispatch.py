"""Which implementation applies a token mask: the Triton kernel (bitmask_triton.py) on CUDA
tensors, the reference elsewhere."""

from __future__ import annotations

import torch

from osserve.ops.dispatch import use_triton
from osserve.ops.sampling.reference import apply_token_bitmask_reference

WRITABLE = (torch.float32, torch.bfloat16, torch.float16)  # the logits dtypes the kernel writes -inf into


def apply_token_bitmask(logits: torch.Tensor, rows: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """-inf, in place, at the tokens bits [R, W] forbid in rows [R] of logits [B, V]; returns logits."""
    if use_triton(logits) and logits.dtype in WRITABLE and logits.stride(1) == 1:
        from osserve.ops.sampling.bitmask_triton import apply_token_bitmask_triton

        return apply_token_bitmask_triton(logits, rows, bits)
    return apply_token_bitmask_reference(logits, rows, bits)
