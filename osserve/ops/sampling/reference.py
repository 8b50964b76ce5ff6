"""Sampling ops, the specification in plain PyTorch: a grammar's token mask applied to logits.

A mask row is one int32 word per 32 tokens, little-endian by bit: token t is allowed where bit
t % 32 of word t // 32 is set (llguidance's layout). The sampler itself (engine/worker/sampler.py)
is the reference for the Gumbel race of gumbel_triton.py.
"""

from __future__ import annotations

import torch


def apply_token_bitmask_reference(logits: torch.Tensor, rows: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """logits [B, V] with -inf written, in place, at the tokens that bits [R, W] forbid in rows
    rows [R] (int64 row indices of logits); the other rows untouched. Returns logits."""
    vocab = logits.shape[1]
    shifts = torch.arange(32, device=bits.device, dtype=torch.int32)
    allowed = ((bits.to(logits.device)[:, :, None] >> shifts) & 1).flatten(1)[:, :vocab].bool()
    idx = rows.to(logits.device)
    logits[idx] = logits[idx].masked_fill(~allowed, float("-inf"))
    return logits
