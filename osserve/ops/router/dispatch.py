"""Which router implementation runs. On CUDA tensors `route` runs, for T <= FUSED_MAX_TOKENS
(decode), one Triton kernel for logits + top-k + softmax (fused_triton.py), and above that cuBLAS
for the logits and one Triton kernel for top-k + softmax (topk_triton.py); elsewhere the reference.
`route_with_plan` also hands back the MoE's routing plan where that one kernel can build it, and
`add_norm_route_with_plan` first takes the post-attention residual add + RMSNorm, into the same
kernel where it can."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from osserve.ops.dispatch import use_triton
from osserve.ops.norm.dispatch import add_rms_norm
from osserve.ops.router.reference import route_reference

if TYPE_CHECKING:
    from osserve.ops.moe.plan import RoutingPlan


def route(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, top_k: int,
    counters: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H], weight [E, H], bias [E] -> (weights [T, k] in x's dtype, ids [T, k] int64).

    counters: the fused small-batch kernel's zeroed scratch (`router_counters`), kept by the
    caller so the kernel needs no zero-fill launch of its own; None works, one launch slower.
    """
    if use_triton(x) and top_k & (top_k - 1) == 0:
        from osserve.ops.router.fused_triton import fits_fused_router, router_gemm_topk_triton

        if fits_fused_router(x.shape[0], weight.shape[0], top_k):
            return router_gemm_topk_triton(x, weight, bias, top_k, counters)
        from osserve.ops.router.topk_triton import route_triton

        return route_triton(x, weight, bias, top_k)
    return route_reference(x, weight, bias, top_k)


def _fused_plan_block_m(rows: torch.Tensor, num_experts: int, top_k: int, plan_block_m: int | None) -> int | None:
    """plan_block_m where the fused router kernel can build the routing plan for `rows`' tokens in
    its own launch (CUDA, one token block: decode); None where the MoE must build its own."""
    if plan_block_m is None or not use_triton(rows) or top_k & (top_k - 1):
        return None
    from osserve.ops.router.fused_triton import fits_fused_router, fits_router_plan

    t = rows.shape[0]
    return plan_block_m if fits_fused_router(t, num_experts, top_k) and fits_router_plan(t) else None


def route_with_plan(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, top_k: int, counters: torch.Tensor | None,
    plan_block_m: int | None,
) -> tuple[torch.Tensor, torch.Tensor, RoutingPlan | None]:
    """route, plus the MoE's routing plan for token tiles of plan_block_m (moe/plan.py's align_tokens'
    result) where the fused router builds it in the same launch (CUDA, one token block: decode);
    otherwise None, and the MoE builds its own. plan_block_m None: no plan wanted."""
    block_m = _fused_plan_block_m(x, weight.shape[0], top_k, plan_block_m)
    if block_m is not None:
        from osserve.ops.router.fused_triton import router_plan_triton

        return router_plan_triton(x, weight, bias, top_k, counters, block_m)
    return (*route(x, weight, bias, top_k, counters), None)


def add_norm_route_with_plan(
    a: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor,
    bias: torch.Tensor, top_k: int, counters: torch.Tensor | None, plan_block_m: int | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, RoutingPlan | None]:
    """x, residual = norm.add_rms_norm(a, residual, norm_weight, eps), then route_with_plan(x, ...):
    (x, residual, weights, ids, plan). On CUDA at up to router_gemm_triton.NORM_MAX_TOKENS tokens
    (decode) one kernel does it all; its normed rows may then differ from add_rms_norm's in the
    last bit (the row's sum of squares is reduced by other warps), its residual does not."""
    block_m = _fused_plan_block_m(residual, weight.shape[0], top_k, plan_block_m)
    if block_m is not None:
        from osserve.ops.router.fused_triton import NormInput, fits_router_norm, router_norm_plan_triton

        if fits_router_norm(residual.shape[0]):
            return router_norm_plan_triton(NormInput(a, residual, norm_weight, eps), weight, bias, top_k, counters,
                                           block_m)
    x, residual = add_rms_norm(a, residual, norm_weight, eps)
    return (x, residual, *route_with_plan(x, weight, bias, top_k, counters, plan_block_m))
