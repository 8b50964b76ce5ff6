"""The gpt-oss router: a biased linear layer, top-k of its logits, softmax over those k.

`route_reference` is the specification; `route` runs cuBLAS for the logits and one Triton kernel
for top-k + softmax on CUDA tensors (ties: lower expert index first, see router_triton).
"""

from __future__ import annotations

import torch

from osserve.ops.dispatch import use_triton


def route_reference(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, top_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router: logits -> top-k -> softmax over those k. Returns (weights [T, k], ids [T, k])."""
    logits = torch.nn.functional.linear(x, weight, bias)
    top_vals, top_ids = torch.topk(logits, top_k, dim=-1)
    return torch.softmax(top_vals, dim=-1, dtype=top_vals.dtype), top_ids


def route(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, top_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H], weight [E, H], bias [E] -> (weights [T, k] in x's dtype, ids [T, k] int64)."""
    if use_triton(x) and top_k & (top_k - 1) == 0:
        from osserve.ops.router_triton import route_triton

        return route_triton(x, weight, bias, top_k)
    return route_reference(x, weight, bias, top_k)
