"""RMSNorm, as gpt-oss computes it: in float32, weight applied before casting back. This file is
the specification; dispatch.py's `add_rms_norm` / `embed_rms_norm` run the one-pass Triton kernels
(norm/norm_triton.py) on CUDA tensors.

The x of `add_rms_norm` may come unreduced, [S, T, k, H]: as the fused MoE leaves its output (K
splits by each token's k experts, see ops/moe/reference.py), or a decode projection its K-split partials
(k = 1, ops/linear/dispatch.py). It is summed over S and k in float32 and rounded to the residual's dtype
before the add, so neither needs a summing pass of its own.

`embed_rms_norm` is the first layer's norm with the embedding's gather in it, which may also
take ids still on the device (PendingTokens)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class PendingTokens:
    """Input ids still on the device (async scheduling): token t's id is sampled[rows[t]] where
    rows[t] >= 0, else the id given. embed_rms_norm reads them in its gather."""

    rows: torch.Tensor  # [T] int64
    sampled: torch.Tensor  # [N] int64: the last step's sampled ids


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [T, H], weight [H] -> [T, H] in x's dtype."""
    xf = x.to(torch.float32)
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.to(torch.float32) * xf).to(x.dtype)


def reduce_parts(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[T, H] as it is, or unreduced [S, T, k, H] summed over S and k (float32, rounded once)."""
    return x.float().sum((0, 2)).to(dtype) if x.dim() == 4 else x


def add_rms_norm_reference(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + residual) normed, and the new residual x + residual (the fused op's contract)."""
    summed = reduce_parts(x, residual.dtype) + residual
    return rms_norm_reference(summed, weight, eps), summed


def embed_rms_norm_reference(ids: torch.Tensor, table: torch.Tensor, weight: torch.Tensor, eps: float,
                             pending: PendingTokens | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(table[ids]), table[ids]): the first layer's input and the residual stream."""
    if pending is not None:
        ids = torch.where(pending.rows >= 0, pending.sampled[pending.rows.clamp(min=0)], ids)
    rows = F.embedding(ids, table)
    return rms_norm_reference(rows, weight, eps), rows
