"""Which RMSNorm implementation runs: the one-pass Triton kernels (norm/norm_triton.py) on CUDA
tensors, the reference elsewhere. The entries' contracts are stated in reference.py."""

from __future__ import annotations

import torch

from osserve.ops.dispatch import use_triton
from osserve.ops.norm.reference import (
    PendingTokens,
    add_rms_norm_reference,
    embed_rms_norm_reference,
    rms_norm_reference,
)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [T, H] normed alone (no residual): the EAGLE3 draft's input norms."""
    if use_triton(x):
        from osserve.ops.norm.norm_triton import add_rms_norm_triton

        return add_rms_norm_triton(x, None, weight, eps)[0]
    return rms_norm_reference(x, weight, eps)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    if use_triton(x):
        from osserve.ops.norm.norm_triton import add_rms_norm_triton

        return add_rms_norm_triton(x, residual, weight, eps)
    return add_rms_norm_reference(x, residual, weight, eps)


def embed_rms_norm(ids: torch.Tensor, table: torch.Tensor, weight: torch.Tensor, eps: float,
                   pending: PendingTokens | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    if use_triton(table):
        from osserve.ops.norm.norm_triton import embed_rms_norm_triton

        if pending is None:
            return embed_rms_norm_triton(ids, table, weight, eps)
        return embed_rms_norm_triton(ids, table, weight, eps, pending.rows, pending.sampled)
    return embed_rms_norm_reference(ids, table, weight, eps, pending)
