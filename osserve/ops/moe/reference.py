"""gpt-oss's mixture of experts, the specification in plain PyTorch: each token's top-k experts
(clamped SwiGLU between gate_up and down, biases on both), summed with the router's weights. Every
fast path (dispatch.py) computes this function."""

from __future__ import annotations

import torch

from osserve.ops.moe.weights import SWIGLU_ALPHA, ExpertWeights


def swiglu(gate_up: torch.Tensor, limit: float) -> torch.Tensor:
    """[N, 2I] interleaved -> [N, I]: glu = min(gate, limit); up clamped; glu*sigmoid(a*glu)*(up+1)."""
    gate = gate_up[..., ::2].clamp(max=limit)
    up = gate_up[..., 1::2].clamp(min=-limit, max=limit)
    return gate * torch.sigmoid(gate * SWIGLU_ALPHA) * (up + 1)


def moe_reference(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    experts: ExpertWeights,
    swiglu_limit: float,
) -> torch.Tensor:
    """x [T, H] -> [T, H]: the sum over each token's k experts of weight * expert(x).

    Dequantises and loops over the experts that received tokens; computes in x's dtype.
    """
    return moe_dense_reference(x, topk_weights, topk_ids, experts.gate_up(x.dtype), experts.gate_up_bias,
                               experts.down(x.dtype), experts.down_bias, swiglu_limit)


def moe_dense_reference(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w1: torch.Tensor,  # [E, 2I, H] gate/up interleaved by row
    b1: torch.Tensor,  # [E, 2I]
    w2: torch.Tensor,  # [E, H, I]
    b2: torch.Tensor,  # [E, H]
    swiglu_limit: float,
) -> torch.Tensor:
    """moe_reference on unquantised expert weights (differentiable: the demo model trains on it)."""
    out = torch.zeros_like(x)
    for e in torch.unique(topk_ids).tolist():
        token_idx, slot = torch.where(topk_ids == e)
        h = torch.nn.functional.linear(x[token_idx], w1[e], b1[e].to(x.dtype))
        h = torch.nn.functional.linear(swiglu(h, swiglu_limit), w2[e], b2[e].to(x.dtype))
        out.index_add_(0, token_idx, h * topk_weights[token_idx, slot, None])
    return out
