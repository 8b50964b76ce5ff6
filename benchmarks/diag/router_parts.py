"""Leave-out variants of the fused decode router (router/fused_triton.py), for bench_decode.py
--variant: each swaps one of the kernel's parts for a few plain stores, so that the TPOT difference
is that part's cost on the step's critical path. The routing they produce is fixed (token t's k
experts are 0..k-1: batch 1 still reads four experts), so outputs are garbage: timing only.

The swap replaces names in router_gemm_triton's globals, which Triton resolves when it first
compiles the kernel: apply() must run before the router's first launch in the process (one
variant per process).

- router-fixed-plan: build_plan -> stores of the plan of ids 0..k-1 (no loads, no reductions); above
  one token only (one token's plan is a few stores already, moe_align.plan_one_token);
- router-fixed-ids: the top-k + softmax -> stores of ids 0..k-1 (the logits still reduced once, so
  the GEMM stays live); the plan built from them as usual.
"""

from __future__ import annotations

import triton
import triton.language as tl

# The router's own part, bound here before apply() swaps the router's name for a variant.
from osserve.ops.router.fused_triton import _bias_topk_softmax as _real_bias_topk_softmax

VARIANTS = ("router-fixed-plan", "router-fixed-ids", "router-topk-then-fixed-ids")


@triton.jit
def _fixed_plan(ids_ptr, sorted_ptr, block_expert_ptr, num_padded_ptr, M, max_padded, max_blocks,
                BLOCK_M: tl.constexpr, E_P2: tl.constexpr, CHUNK: tl.constexpr):  # noqa: ANN001
    """Slot r alone in tile r, of expert r mod E_P2: build_plan's result for ids 0..M-1 (M <= E)."""
    for start in range(0, max_padded, CHUNK):
        rows = start + tl.arange(0, CHUNK)
        first = (rows % BLOCK_M == 0) & (rows // BLOCK_M < M)
        tl.store(sorted_ptr + rows, tl.where(first, rows // BLOCK_M, M), mask=rows < max_padded)
    for start in range(0, max_blocks, CHUNK):
        blocks = start + tl.arange(0, CHUNK)
        tl.store(block_expert_ptr + blocks, tl.where(blocks < M, blocks % E_P2, -1), mask=blocks < max_blocks)
    tl.store(num_padded_ptr, M * BLOCK_M)


@triton.jit
def _fixed_ids(logits, bias, alive, rows, row_ok, cols, col_ok, x_ptr, out_w_ptr, out_ids_ptr,
               K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr):  # noqa: ANN001, ANN201
    """Ids 0..K-1 and weights 1/K for every row; one reduction of the logits keeps them live."""
    ks = tl.arange(0, K)[None, :]
    live = tl.max(tl.where(alive, logits, float("-inf")), axis=1)
    ids = tl.zeros([BLOCK_T, K], dtype=tl.int64) + ks + (live != live).to(tl.int64)[:, None]  # NaN: never
    out = rows.to(tl.int64)[:, None] * K + ks
    tl.store(out_w_ptr + out, tl.full([BLOCK_T, K], 1.0 / K, tl.float32).to(out_w_ptr.dtype.element_ty),
             mask=row_ok[:, None])
    tl.store(out_ids_ptr + out, ids, mask=row_ok[:, None])
    return ids


@triton.jit
def _topk_then_fixed_ids(logits, bias, alive, rows, row_ok, cols, col_ok, x_ptr, out_w_ptr, out_ids_ptr,
                         K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr):  # noqa: ANN001, ANN201
    """The real bias + top-k + softmax, then ids 0..K-1 stored over its ids: the top-k's cost kept,
    the experts read fixed."""
    _real_bias_topk_softmax(logits, bias, alive, rows, row_ok, cols, col_ok, x_ptr, out_w_ptr, out_ids_ptr,
                            K, BLOCK_T, BLOCK_E)
    tl.debug_barrier()
    ks = tl.arange(0, K)[None, :]
    out = rows.to(tl.int64)[:, None] * K + ks
    ids = tl.zeros([BLOCK_T, K], dtype=tl.int64) + ks
    tl.store(out_ids_ptr + out, ids, mask=row_ok[:, None])
    return ids


def apply(variant: str) -> None:
    """Swap the router part `variant` names (VARIANTS) before the router first compiles."""
    import osserve.ops.router.fused_triton as router

    assert variant in VARIANTS, variant
    if variant == "router-fixed-plan":
        router.build_plan = _fixed_plan
    elif variant == "router-fixed-ids":
        router._bias_topk_softmax = _fixed_ids
    else:
        router._bias_topk_softmax = _topk_then_fixed_ids
