"""The gpt-oss router, the specification: a biased linear layer, top-k of its logits, softmax over
those k. Ties: lower expert index first. dispatch.py picks the fast paths."""

from __future__ import annotations

import torch


def route_reference(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, top_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router: logits -> top-k -> softmax over those k. Returns (weights [T, k], ids [T, k])."""
    logits = torch.nn.functional.linear(x, weight, bias)
    top_vals, top_ids = torch.topk(logits, top_k, dim=-1)
    return torch.softmax(top_vals, dim=-1, dtype=top_vals.dtype), top_ids
