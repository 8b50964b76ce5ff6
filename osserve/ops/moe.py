"""Mixture of experts: gpt-oss's router and clamped-SwiGLU experts.

Expert weights stay MXFP4 (see ops/mxfp4.py): gate_up [E, 2I, H] with gate and up interleaved
by row (even rows gate, odd rows up), down [E, H, I], both out x in, plus biases.
This file is the specification (plain PyTorch); fast paths implement the same function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from osserve.ops.dispatch import use_triton
from osserve.ops.mxfp4 import dequantize_mxfp4

if TYPE_CHECKING:
    from osserve.ops.moe_align import RoutingPlan
    from osserve.ops.moe_triton import PreparedExperts

SWIGLU_ALPHA = 1.702
# Above this many tokens (and above the swapped kernel's range) experts are dequantised once per
# forward and run on cuBLAS.
PREFILL_DENSE_MIN_TOKENS = 512


@dataclass
class ExpertWeights:
    """One layer's experts as stored in the checkpoint (MXFP4), plus the fused kernel's layout."""

    gate_up_blocks: torch.Tensor | None  # [E, 2I, H/32, 16] uint8
    gate_up_scales: torch.Tensor | None  # [E, 2I, H/32] uint8
    gate_up_bias: torch.Tensor  # [E, 2I]
    down_blocks: torch.Tensor | None  # [E, H, I/32, 16] uint8
    down_scales: torch.Tensor | None  # [E, H, I/32] uint8
    down_bias: torch.Tensor  # [E, H]
    prepared: PreparedExperts | None = None  # the Triton kernel's layout, set once at load (prepare())

    @property
    def num_experts(self) -> int:
        return self.gate_up_bias.shape[0]

    def gate_up(self, dtype: torch.dtype) -> torch.Tensor:
        assert self.gate_up_blocks is not None and self.gate_up_scales is not None
        return dequantize_mxfp4(self.gate_up_blocks, self.gate_up_scales, dtype)

    def down(self, dtype: torch.dtype) -> torch.Tensor:
        assert self.down_blocks is not None and self.down_scales is not None
        return dequantize_mxfp4(self.down_blocks, self.down_scales, dtype)

    def plan_block_m(self, num_tokens: int, top_k: int) -> int | None:
        """The token tile of the routing plan fused_moe would build for this batch, where it takes
        one from its caller (the Gluon kernel: fragments prepared); else None."""
        if self.prepared is None or not self.prepared.fragments:
            return None
        from osserve.ops.moe_gluon import BLOCK_T_BY_SLOTS
        from osserve.ops.moe_swapped import by_slots

        return by_slots(BLOCK_T_BY_SLOTS, num_tokens, self.num_experts, top_k)

    def prepare(self, keep_original: bool = False, fragments: bool = False) -> None:
        """Build the fused kernels' layout once (at load, on the GPU); `fragments`: the Gluon kernel's.

        Drops the checkpoint-layout MXFP4 tensors unless asked (the layout is the same size: keeping
        both doubles expert memory, which 120b cannot afford); the reference path then needs them back.
        """
        from osserve.ops.moe_triton import prepare_mxfp4_experts

        self.prepared = prepare_mxfp4_experts(self, fragments=fragments)
        if not keep_original:
            self.gate_up_blocks = self.gate_up_scales = self.down_blocks = self.down_scales = None



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


def fused_moe(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    experts: ExpertWeights,
    swiglu_limit: float,
    reduce: bool = True,
    plan: RoutingPlan | None = None,
) -> torch.Tensor:
    """x [T, H] -> [T, H].

    Dispatch on CUDA, once `experts.prepare()` ran: up to 4096 tokens (decode, serving's mixed
    steps) the weights-as-left-operand 4-bit kernel (moe_gluon.py on Hopper, else moe_swapped.py);
    above, whole prompts, the per-expert dequantise + cuBLAS path when the checkpoint-layout
    tensors were kept, else the Gluon kernel in chunks or the token-tiled 4-bit kernel
    (moe_triton.py). Elsewhere: the reference.

    reduce=False: the 4-bit kernels may leave their output unreduced, [S, T, k, H] (K splits x each
    token's k weighted expert rows), for ops/norm.py's add_rms_norm to sum: one launch and one
    round trip fewer per layer. plan: topk_ids' routing plan if the router built it
    (router.route_with_plan for experts.plan_block_m), saving the kernel's own align launch."""
    if use_triton(x):
        from osserve.ops import moe_swapped

        prepared = experts.prepared
        # Up to MAX_TOKENS (both 4-bit kernels' range) the fused kernels win; the dense path is for
        # whole prompts (it syncs the host once per expert: ~0.3 s a step at serving's 1-2k-token
        # mixed batches).
        if prepared is not None and x.shape[0] <= moe_swapped.MAX_TOKENS:
            return _fused(x, topk_weights, topk_ids, prepared, swiglu_limit, reduce, plan)
        dense_ok = experts.gate_up_blocks is not None and not torch.cuda.is_current_stream_capturing()
        if dense_ok and x.shape[0] > PREFILL_DENSE_MIN_TOKENS:
            from osserve.ops.moe_dense import moe_prefill_dense

            return moe_prefill_dense(x, topk_weights, topk_ids, experts, swiglu_limit)
        if prepared is not None and prepared.fragments:  # the Gluon kernel, in chunks of its MAX_TOKENS
            return _fused(x, topk_weights, topk_ids, prepared, swiglu_limit)
        if prepared is not None:
            from osserve.ops.moe_triton import fused_moe_triton

            return fused_moe_triton(x, topk_weights, topk_ids, prepared, swiglu_limit)
    return moe_reference(x, topk_weights, topk_ids, experts, swiglu_limit)


def _fused(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, prepared: PreparedExperts,
           swiglu_limit: float, reduce: bool = True, plan: RoutingPlan | None = None) -> torch.Tensor:
    """The 4-bit kernel for the prepared layout: Gluon (Hopper fragments) or Triton (re-paired nibbles)."""
    if prepared.fragments:
        from osserve.ops.moe_gluon import fused_moe_gluon

        return fused_moe_gluon(x, topk_weights, topk_ids, prepared, swiglu_limit, reduce=reduce, plan=plan)
    from osserve.ops.moe_swapped import fused_moe_swapped

    return fused_moe_swapped(x, topk_weights, topk_ids, prepared, swiglu_limit, reduce=reduce)
