"""Which MoE implementation runs a batch: `fused_moe`, the entry the model calls.

On CUDA, once the experts' kernel layout exists (layout.py, at load):
- up to swapped.MAX_TOKENS tokens (decode, serving's mixed steps): the weights-as-left-operand
  4-bit kernel: gluon.py on Hopper, swapped.py (portable Triton) elsewhere;
- above, whole prompts: dense.py (the layer dequantised once, grouped GEMMs) where the checkpoint-layout
  tensors were kept and the batch repays the dequantisation (dense_repays), else gluon.py in
  chunks, else tiled.py (the portable token-tiled kernel).
Elsewhere: reference.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from osserve.ops.dispatch import use_triton
from osserve.ops.moe.reference import moe_reference
from osserve.ops.moe.weights import ExpertWeights, PreparedExperts

if TYPE_CHECKING:
    from osserve.ops.moe.plan import RoutingPlan

# The kernels' modules are imported where they run (CUDA): a CPU process never loads them.

# Above this many tokens (and above the swapped kernel's range) experts are dequantised once per
# forward and run as grouped bf16 GEMMs.
PREFILL_DENSE_MIN_TOKENS = 512
# ... and where the Gluon kernel runs, only once its experts average this many rows (token x
# expert pairs): the dequantisation is every expert's, whatever their rows, so the 120b's 128
# experts need 2.5 times the 20b's tokens to repay it. H200, 2026-11-28, diag/moe_dense_grouped.py,
# µs a layer, Gluon (in chunks of 4,096) / dense: 120b T=8,192 (256 rows an expert) 5,345 / 6,001,
# T=10,240 (320) 6,996 / 7,056, T=12,288 8,078 / 7,196; 20b T=4,096 (512) 2,345 / 2,245.
DENSE_MIN_ROWS_PER_EXPERT = 320


def dense_repays(num_tokens: int, top_k: int, num_experts: int, gluon: bool) -> bool:
    """Whether a batch above the fused kernels' range takes the dense path rather than the Gluon
    kernel in chunks (where there is one: `gluon`)."""
    if num_tokens <= PREFILL_DENSE_MIN_TOKENS:
        return False
    return not gluon or num_tokens * top_k >= DENSE_MIN_ROWS_PER_EXPERT * num_experts


def plan_block_m(experts: ExpertWeights, num_tokens: int, top_k: int) -> int | None:
    """The token tile of the routing plan fused_moe would build for this batch, where it takes
    one from its caller (the Gluon kernel: fragments prepared); else None."""
    if experts.prepared is None or not experts.prepared.fragments:
        return None
    from osserve.ops.moe.gluon_tiles import BLOCK_T_BY_SLOTS
    from osserve.ops.moe.swapped import by_slots

    return by_slots(BLOCK_T_BY_SLOTS, num_tokens, experts.num_experts, top_k)


def fused_moe(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    experts: ExpertWeights,
    swiglu_limit: float,
    reduce: bool = True,
    plan: RoutingPlan | None = None,
) -> torch.Tensor:
    """x [T, H] -> [T, H], by the implementation the module docstring describes.

    reduce=False: the 4-bit kernels may leave their output unreduced, [S, T, k, H] (K splits x each
    token's k weighted expert rows), for ops/norm/reference.py's add_rms_norm to sum: one launch and one
    round trip fewer per layer. plan: topk_ids' routing plan if the router built it
    (router's route_with_plan for plan_block_m), saving the kernel's own align launch."""
    if use_triton(x):
        from osserve.ops.moe import swapped

        prepared = experts.prepared
        # Up to MAX_TOKENS (both 4-bit kernels' range) the fused kernels win; the dense path is for
        # whole prompts: it dequantises the layer's experts on each call (the 20b's: 1.6 GB of bf16
        # written and read again), which a few thousand tokens do not repay (H100, µs a layer: at
        # 2,304 tokens 2,081 against 1,389; level at 4,096; at 8,192 3,688 against 4,889;
        # benchmarks/diag/moe_dense_grouped.py).
        if prepared is not None and x.shape[0] <= swapped.MAX_TOKENS:
            return _fused(x, topk_weights, topk_ids, prepared, swiglu_limit, reduce, plan)
        dense_ok = experts.gate_up_blocks is not None and not torch.cuda.is_current_stream_capturing()
        gluon = prepared if prepared is not None and prepared.fragments else None  # Hopper's layout
        if dense_ok and dense_repays(x.shape[0], topk_ids.shape[1], experts.num_experts, gluon is not None):
            from osserve.ops.moe.dense import moe_prefill_dense

            return moe_prefill_dense(x, topk_weights, topk_ids, experts, swiglu_limit)
        if gluon is not None:  # the Gluon kernel, in chunks of its MAX_TOKENS
            return _fused(x, topk_weights, topk_ids, gluon, swiglu_limit)
        if prepared is not None:
            from osserve.ops.moe.tiled import fused_moe_triton

            return fused_moe_triton(x, topk_weights, topk_ids, prepared, swiglu_limit)
    return moe_reference(x, topk_weights, topk_ids, experts, swiglu_limit)


def _fused(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, prepared: PreparedExperts,
           swiglu_limit: float, reduce: bool = True, plan: RoutingPlan | None = None) -> torch.Tensor:
    """The 4-bit kernel for the prepared layout: Gluon (Hopper fragments) or Triton (re-paired nibbles)."""
    if prepared.fragments:
        from osserve.ops.moe.gluon import fused_moe_gluon

        return fused_moe_gluon(x, topk_weights, topk_ids, prepared, swiglu_limit, reduce=reduce, plan=plan)
    from osserve.ops.moe.swapped import fused_moe_swapped

    return fused_moe_swapped(x, topk_weights, topk_ids, prepared, swiglu_limit, reduce=reduce)
