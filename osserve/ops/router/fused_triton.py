"""Small-batch router in one launch: logits = x·Wᵀ + b, top-k, softmax over the k (T <= 128).

At decode sizes the router GEMM ([T, 2880] × [2880, E], E 32 or 128) reads only the weight
(184 / 737 KB) and costs mostly launch latency: cuBLAS for the logits plus the top-k kernel are
two launches and a [T, E] round trip through memory. Here one kernel does both (the idea of
SGLang PR #20755, with the top-k fused in).

Work split: programs form a (token block, H split) grid. One program reading the whole weight
would be bound by one SM's bandwidth, so H is split across SPLIT programs per token block; each
writes its fp32 partial logits [BLOCK_T, E] to a scratch buffer, then bumps a per-token-block
counter. The program that finds itself last sums the partials in split order (so results are
deterministic, unlike atomic adds), adds the bias, rounds to x's dtype (as F.linear's output
would be, so expert choice matches the cuBLAS path), runs top-k + softmax, and resets the counter
to 0 for the next call. The counters must therefore start at zero and persist across calls:
`router.router_counters` makes them; the model keeps one set per MLP (a non-persistent buffer),
so inside a CUDA graph the fused router is a single node. The last program reads all the
partials at once (the split count is a compile-time constant, the loads unrolled): one round
trip to L2 instead of one per split. It reads only its block's real rows (FINISH_T, a power of
two): with all 16 rows of 128 experts from 23 splits in flight its registers spilled. With the
packed-key top-k (router_triton.topk_softmax_rows) that took 88 µs off the 120b's batch-1 step
(H100, 2026-11-25, 802f2c2: 2.702 -> 2.614 ms; benchmarks/history/2026-11-25-batch1-decode.md).

When the batch is one token block (T <= BLOCK_T, decode), that last program also builds the
MoE's routing plan (moe/plan.py's build_plan) from the ids it just wrote: one launch fewer per layer.
At one token it writes the plan from the ids still in its registers (moe/plan.py's plan_one_token).

Up to NORM_MAX_TOKENS tokens the router can also take the post-attention residual add + RMSNorm
(router_norm_plan_triton): its input is then the attention output (unreduced K-split partials
too) and the residual. Every program first computes each token's whole-row RMS (the row is at
most a few tens of KB, read from L2 by all SPLITS programs), then normalises its own H slice on
the way into its MMAs, and writes that slice of the new residual and of the normed rows (the
MoE's input). One launch, the norm's, fewer per layer.

Behind the PDL wait (ops/pdl.py) the kernel is a chain of round trips: the rows, the partials'
publication, the last program's read of them. So a program loads its first H block's weights and
norm weights, which are constants, before the wait, and its first block's activations go out with
the whole rows'. At decode (23 splits of one 128-column block at H = 2880) nothing but activations
is then read after the wait. H100, batch-1 median TPOT (bench_decode.py, the tree before against
this one, same call): 20b 1.911 -> 1.900 ms, in another call 1.904 -> 1.888 ms and 120b 2.776 -> 2.754.
The bias, which only the last program needs, is loaded before the wait too, and that program
resets its counter with a plain store: its round trips after the publication are then the
partials' read alone, where it had an atomic exchange, the bias and the ids' read-back besides.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from osserve.ops.moe.plan import PlanShape, RoutingPlan, build_plan, empty_plan, plan_one_token
from osserve.ops.norm.norm_triton import add_parts, row_rstd
from osserve.ops.pdl import pdl_enter, pdl_launch, prefetch_before_wait, prefetch_rows
from osserve.ops.router.counters import FUSED_MAX_TOKENS, router_counters
from osserve.ops.router.topk_triton import topk_softmax_rows

MAX_EXPERTS = 256  # [BLOCK_T, BLOCK_E] fp32 tiles stay in registers
BLOCK_T = 16  # tl.dot's minimum M; rows past T are masked (their loads cost nothing)
# H columns per MMA block. A program loads its first block's weights before its PDL wait, so at
# decode (one block a program) only the activations are left behind the wait; [128, E] bf16 stays
# in registers up to 128 experts (gpt-oss: 32 and 128), above that half a block.
BLOCK_H = 128
BLOCK_H_MANY_EXPERTS = 64
# H splits per token block. Measured on an H100 (benchmarks/bench_router.py, 2026-11-22), 8 was
# the fastest at every T in 1..128 for E=32 and E=128 (1, 4, 16, 32, 45 were all slower), the
# router then alone. Since it takes the norm and builds the plan behind a PDL wait, one token block
# (decode up to 16 tokens) gains from more: H100, bench_decode.py --ab router-splits(-more), batch-1
# median TPOT by H_SPLITS_ONE_BLOCK 1 / 2 / 4 / 8 / 16 / 32 / 45: 20b 2.344 / 2.091 / 1.990 / 1.937-1.938
# / 1.915-1.919 / 1.911 / 1.924 ms; 120b (8 / 16 / 32 / 45) 2.824 / 2.780 / 2.775 / 2.879 ms. 32 rounds
# to 23 splits of one 128-column block at H = 2880.
H_SPLITS = 8
H_SPLITS_ONE_BLOCK = 32
NORM_MAX_TOKENS = 4  # the norm's whole-row pass is unrolled over the tokens


@dataclass(frozen=True)
class NormInput:
    """The post-attention add + RMSNorm the router takes over: norm(a + residual) is its input."""

    a: torch.Tensor  # [T, H], or unreduced K-split partials [S, T, 1, H] (ops/linear/dispatch.py)
    residual: torch.Tensor  # [T, H]
    weight: torch.Tensor  # [H]
    eps: float


@triton.jit
def _router_gemm_topk_kernel(
    x_ptr, w_ptr, b_ptr, part_ptr, cnt_ptr, out_w_ptr, out_ids_ptr,
    sorted_ptr, block_expert_ptr, num_padded_ptr, max_padded, max_blocks,
    num_tokens, hidden, stride_xt, stride_we, h_per_split, part_rows,
    a_ptr, res_ptr, nw_ptr, sum_ptr, eps, stride_as, stride_at,  # NORM: x = norm(a + res); sum_ptr: a + res
    E: tl.constexpr, K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_H: tl.constexpr, SPLITS: tl.constexpr, DOT_PRECISION: tl.constexpr,
    PLAN: tl.constexpr, PLAN_BLOCK_M: tl.constexpr, E_P2: tl.constexpr, CHUNK: tl.constexpr,
    NORM: tl.constexpr, NORM_ROWS: tl.constexpr, PARTS: tl.constexpr, BLOCK_ROW: tl.constexpr,
    PDL: tl.constexpr, PREFETCH_LINES: tl.constexpr, FINISH_T: tl.constexpr,
):  # noqa: ANN001
    pid_t = tl.program_id(0)
    pid_s = tl.program_id(1)
    rows = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_E)
    row_ok = rows < num_tokens
    col_ok = cols < E
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_xt
    w_cols = w_ptr + cols.to(tl.int64)[None, :] * stride_we
    h_start = pid_s * h_per_split
    h_end = tl.minimum(h_start + h_per_split, hidden)
    # The first H block's weights (and norm weights) are constants: loaded before the wait, so
    # that after it only the activations are a round trip away. Later blocks (more than one per
    # split: small H splits) are loaded in the loop.
    hs = h_start + tl.arange(0, BLOCK_H)
    h_ok = hs < h_end
    wb = tl.load(w_cols + hs[:, None], mask=h_ok[:, None] & col_ok[None, :], other=0.0)
    nw = tl.zeros([BLOCK_H], dtype=tl.float32)
    if NORM:
        nw = tl.load(nw_ptr + hs, mask=h_ok, other=0.0).to(tl.float32)
    bias = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)  # for whichever program finishes
    # This program's weight slice past the first block into L2 while the kernel before ends.
    prefetch_rows(w_ptr + cols.to(tl.int64)[:, None] * stride_we, w_ptr, col_ok, h_start + BLOCK_H, h_end,
                  PREFETCH_LINES)
    pdl_enter(PDL)
    dtype = x_ptr.dtype.element_ty
    rstd = tl.zeros([BLOCK_T], dtype=tl.float32)
    if NORM:  # each token's 1 / RMS over its whole row (one program per token block: pid_t = 0)
        # The first block's new residual first: its loads go out with the whole rows' below.
        first = _add_residual(a_ptr, res_ptr, sum_ptr, rows, row_ok, hs, h_ok, hidden, stride_as, stride_at,
                              PARTS, dtype)
        row_cols = tl.arange(0, BLOCK_ROW)
        for r in tl.static_range(NORM_ROWS):
            if r < num_tokens:
                whole_row = add_parts(a_ptr, res_ptr, r * stride_at + row_cols, r * hidden + row_cols,
                                      row_cols < hidden, stride_as, 0, PARTS, 1, dtype).to(tl.float32)
                rstd = tl.where(rows == r, row_rstd(whole_row, hidden, eps), rstd)
        xb = _normed(first, nw, rstd, x_ptr, rows, row_ok, hs, h_ok, hidden, dtype)
    else:
        xb = tl.load(x_rows + hs[None, :], mask=row_ok[:, None] & h_ok[None, :], other=0.0)
    acc = tl.dot(xb, wb, tl.zeros([BLOCK_T, BLOCK_E], dtype=tl.float32), input_precision=DOT_PRECISION)
    for h in range(h_start + BLOCK_H, h_end, BLOCK_H):
        hs = h + tl.arange(0, BLOCK_H)
        h_ok = hs < h_end
        if NORM:
            nw = tl.load(nw_ptr + hs, mask=h_ok, other=0.0).to(tl.float32)
            new_res = _add_residual(a_ptr, res_ptr, sum_ptr, rows, row_ok, hs, h_ok, hidden, stride_as, stride_at,
                                    PARTS, dtype)
            xb = _normed(new_res, nw, rstd, x_ptr, rows, row_ok, hs, h_ok, hidden, dtype)
        else:
            xb = tl.load(x_rows + hs[None, :], mask=row_ok[:, None] & h_ok[None, :], other=0.0)
        wb = tl.load(w_cols + hs[:, None], mask=h_ok[:, None] & col_ok[None, :], other=0.0)
        acc = tl.dot(xb, wb, acc, input_precision=DOT_PRECISION)

    alive = row_ok[:, None] & col_ok[None, :]
    if SPLITS > 1:
        # Publish this split's partial; the last of the token block's programs finishes the job.
        tile = (pid_s * part_rows + rows)[:, None] * BLOCK_E + cols[None, :]
        tl.store(part_ptr + tile, acc, mask=alive)
        tl.debug_barrier()  # every thread's partial is written before the counter moves
        done = tl.atomic_add(cnt_ptr + pid_t, 1, sem="acq_rel")
        if done == SPLITS - 1:
            # FINISH_T rows: the block's real ones, rounded up to a power of two (decode: 1-4).
            # Every split's tile is loaded at once, so at 128 experts and 16 rows the registers ran out.
            f_rows = pid_t * BLOCK_T + tl.arange(0, FINISH_T)
            f_ok = f_rows < num_tokens
            f_alive = f_ok[:, None] & col_ok[None, :]
            logits = tl.zeros([FINISH_T, BLOCK_E], dtype=tl.float32)
            for s in tl.static_range(SPLITS):  # unrolled, loads issued together; fixed order: deterministic
                f_tile = (s * part_rows + f_rows)[:, None] * BLOCK_E + cols[None, :]
                # .cg: read from L2, where the other SMs' partials are, never a stale L1 line.
                logits += tl.load(part_ptr + f_tile, mask=f_alive, other=0.0, cache_modifier=".cg")
            # Ready for the next call: every split has counted, and the kernel's end orders this
            # store before the next launch, so no atomic (its fence and round trip) is needed.
            tl.store(cnt_ptr + pid_t, 0)
            _finish(logits, bias, f_alive, f_rows, f_ok, cols, col_ok, x_ptr, out_w_ptr, out_ids_ptr,
                    sorted_ptr, block_expert_ptr, num_padded_ptr, num_tokens, max_padded, max_blocks,
                    K, FINISH_T, BLOCK_E, PLAN, PLAN_BLOCK_M, E_P2, CHUNK)
    else:
        _finish(acc, bias, alive, rows, row_ok, cols, col_ok, x_ptr, out_w_ptr, out_ids_ptr,
                sorted_ptr, block_expert_ptr, num_padded_ptr, num_tokens, max_padded, max_blocks,
                K, BLOCK_T, BLOCK_E, PLAN, PLAN_BLOCK_M, E_P2, CHUNK)


@triton.jit
def _add_residual(a_ptr, res_ptr, sum_ptr, rows, row_ok, hs, h_ok, hidden, stride_as, stride_at,
                  PARTS: tl.constexpr, dtype: tl.constexpr):  # noqa: ANN001, ANN201
    """The H block hs of the new residual a + residual [BLOCK_T, BLOCK_H], stored (this program
    is the only one to write it) and returned."""
    ok = row_ok[:, None] & h_ok[None, :]
    tile = rows[:, None] * hidden + hs[None, :]
    new_res = add_parts(a_ptr, res_ptr, rows[:, None] * stride_at + hs[None, :], tile, ok, stride_as, 0, PARTS, 1,
                        dtype)
    tl.store(sum_ptr + tile, new_res, mask=ok)
    return new_res


@triton.jit
def _normed(new_res, nw, rstd, x_ptr, rows, row_ok, hs, h_ok, hidden, dtype: tl.constexpr):  # noqa: ANN001, ANN201
    """The normed rows of an H block, as _add_rms_norm_kernel computes them, stored (the MoE's
    input) and returned for the MMA."""
    xb = (nw[None, :] * (new_res.to(tl.float32) * rstd[:, None])).to(dtype)
    tl.store(x_ptr + rows[:, None] * hidden + hs[None, :], xb, mask=row_ok[:, None] & h_ok[None, :])
    return xb


@triton.jit
def _finish(logits, bias, alive, rows, row_ok, cols, col_ok, x_ptr, out_w_ptr, out_ids_ptr,
            sorted_ptr, block_expert_ptr, num_padded_ptr, num_tokens, max_padded, max_blocks,
            K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, PLAN: tl.constexpr,
            PLAN_BLOCK_M: tl.constexpr, E_P2: tl.constexpr, CHUNK: tl.constexpr):  # noqa: ANN001
    ids = _bias_topk_softmax(logits, bias, alive, rows, row_ok, cols, col_ok, x_ptr, out_w_ptr, out_ids_ptr,
                             K, BLOCK_T, BLOCK_E)
    if PLAN:  # one token block: this program holds every id
        if BLOCK_T == 1:  # FINISH_T: one token (batch-1 decode), its ids still in registers
            plan_one_token(ids, sorted_ptr, block_expert_ptr, num_padded_ptr, K, PLAN_BLOCK_M)
        else:
            tl.debug_barrier()  # the ids just stored are visible to the whole program
            build_plan(out_ids_ptr, sorted_ptr, block_expert_ptr, num_padded_ptr, num_tokens * K, max_padded,
                       max_blocks, PLAN_BLOCK_M, E_P2, CHUNK)


@triton.jit
def _bias_topk_softmax(logits, bias, alive, rows, row_ok, cols, col_ok, x_ptr, out_w_ptr,
                       out_ids_ptr, K: tl.constexpr, BLOCK_T: tl.constexpr,
                       BLOCK_E: tl.constexpr):  # noqa: ANN001, ANN201
    """Bias (float32 [BLOCK_E], loaded before the wait), top-k and softmax; stores the weights and
    ids and returns the ids [BLOCK_T, K]."""
    # Round to x's dtype as F.linear's output is: same expert choice as the unfused path.
    logits = (logits + bias[None, :]).to(x_ptr.dtype.element_ty).to(tl.float32)
    return topk_softmax_rows(logits, alive, rows, row_ok, cols, out_w_ptr, out_ids_ptr, K, BLOCK_T, BLOCK_E)


def fits_fused_router(num_tokens: int, num_experts: int, top_k: int) -> bool:
    return num_tokens <= FUSED_MAX_TOKENS and num_experts <= MAX_EXPERTS and top_k & (top_k - 1) == 0


def default_split(hidden: int, token_blocks: int, h_block: int = BLOCK_H) -> int:
    """H splits per token block: H_SPLITS_ONE_BLOCK for one token block, else H_SPLITS; at least one
    H block (h_block columns) each."""
    splits = H_SPLITS_ONE_BLOCK if token_blocks == 1 else H_SPLITS
    return max(1, min(splits, triton.cdiv(hidden, h_block)))


def block_h(block_e: int) -> int:
    """H columns per MMA block for BLOCK_E expert columns (BLOCK_H's comment)."""
    return BLOCK_H if block_e <= 128 else BLOCK_H_MANY_EXPERTS


def router_gemm_topk_triton(
    x: torch.Tensor,  # [T, H], T <= FUSED_MAX_TOKENS
    weight: torch.Tensor,  # [E, H]
    bias: torch.Tensor,  # [E]
    top_k: int,  # a power of two
    counters: torch.Tensor | None = None,  # from router_counters; None: fresh zeros (one more launch)
    split: int | None = None,  # H splits per token block (None: default_split)
) -> tuple[torch.Tensor, torch.Tensor]:
    """(softmax over the top-k logits [T, k] in x's dtype, expert ids [T, k] int64), as
    `route_reference` up to fp32 accumulation order; ties: lower expert index first."""
    weights, ids, _ = _launch(x, weight, bias, top_k, counters, split, None)
    return weights, ids


def fits_router_plan(num_tokens: int) -> bool:
    """Whether router_plan_triton can build the plan: the batch is one token block."""
    return 0 < num_tokens <= BLOCK_T


def router_plan_triton(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, top_k: int, counters: torch.Tensor | None,
    block_m: int, split: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, RoutingPlan]:
    """router_gemm_topk_triton, plus the MoE's routing plan for token tiles of block_m
    (moe/plan.py's align_tokens' result), from the same launch. T <= BLOCK_T (fits_router_plan)."""
    assert fits_router_plan(x.shape[0]), x.shape
    weights, ids, plan = _launch(x, weight, bias, top_k, counters, split, block_m)
    assert plan is not None
    return weights, ids, plan


def fits_router_norm(num_tokens: int) -> bool:
    """Whether router_norm_plan_triton can take the norm: the batch is at most NORM_MAX_TOKENS tokens."""
    return 0 < num_tokens <= NORM_MAX_TOKENS


def router_norm_plan_triton(
    norm: NormInput, weight: torch.Tensor, bias: torch.Tensor, top_k: int, counters: torch.Tensor | None,
    block_m: int, split: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, RoutingPlan]:
    """norm_triton.add_rms_norm_triton(norm.a, norm.residual, norm.weight, norm.eps) and then
    router_plan_triton on its normed rows, in one launch: (normed rows, new residual, weights, ids,
    plan). The new residual is bit for bit the norm kernel's; the normed rows may differ from it in
    the last bit where the whole-row sum of squares is reduced in another order (other warps)."""
    a, residual = norm.a, norm.residual
    t, h = residual.shape
    assert fits_router_norm(t) and residual.is_contiguous() and norm.weight.shape == (h,)
    assert a.shape == (t, h) or (a.dim() == 4 and a.shape[1:] == (t, 1, h)), a.shape
    assert a.stride(-1) == 1
    x = torch.empty(t, h, dtype=residual.dtype, device=residual.device)  # the normed rows, written by the kernel
    summed = torch.empty_like(x)  # not in place: every program reads every residual row first
    weights, ids, plan = _launch(x, weight, bias, top_k, counters, split, block_m, norm, summed)
    assert plan is not None
    return x, summed, weights, ids, plan


def _launch(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, top_k: int, counters: torch.Tensor | None,
    split: int | None, plan_block_m: int | None, norm: NormInput | None = None, summed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, RoutingPlan | None]:
    """The kernel's launch. With norm, x is the output buffer of the normed rows and summed that of
    the new residual."""
    t, h = x.shape
    e = weight.shape[0]
    assert fits_fused_router(t, e, top_k) and top_k <= e, (t, e, top_k)
    assert weight.shape[1] == h and bias.shape == (e,) and x.stride(1) == 1 and weight.stride(1) == 1
    weights = torch.empty(t, top_k, dtype=x.dtype, device=x.device)
    ids = torch.empty(t, top_k, dtype=torch.int64, device=x.device)
    plan_shape, plan = None, None
    plan_args: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int] = (ids, ids, ids, 0, 0)  # unless PLAN
    if plan_block_m is not None:
        plan_shape = PlanShape.of(t * top_k, e, plan_block_m)
        plan = empty_plan(plan_shape, plan_block_m, x.device)
        plan_args = (plan.sorted_slots, plan.block_expert, plan.num_padded, plan_shape.max_padded,
                     plan_shape.max_blocks)
    if t == 0:
        return weights, ids, plan
    token_blocks = triton.cdiv(t, BLOCK_T)
    block_e = max(16, triton.next_power_of_2(e))
    h_block = block_h(block_e)
    split = split or default_split(h, token_blocks, h_block)
    # Whole H blocks per split, so only the last split sees a ragged end.
    h_per_split = triton.cdiv(triton.cdiv(h, split), h_block) * h_block
    split = triton.cdiv(h, h_per_split)
    part_rows = token_blocks * BLOCK_T
    if split > 1:
        partials = torch.empty(split * part_rows * block_e, dtype=torch.float32, device=x.device)
        if counters is None:
            counters = router_counters(x.device)
        assert counters.dtype == torch.int32 and counters.numel() >= token_blocks
    else:
        partials = counters = weights  # unused: the kernel's single-split branch is compiled
    norm_args: tuple = (x, x, x, x, 0.0, 0, 0)  # unless NORM
    if norm is not None:
        a = norm.a
        strides = (a.stride(0), a.stride(1)) if a.dim() == 4 else (0, a.stride(0))
        norm_args = (a, norm.residual, norm.weight, summed, norm.eps, *strides)
    pdl = pdl_launch(x.device)
    # The L2 prefetch covers what the first block (loaded before the wait) leaves: none at decode.
    prefetch = triton.cdiv((h_per_split - h_block) * weight.element_size(), 128)
    prefetch = prefetch if prefetch_before_wait(x.device) else 0
    _router_gemm_topk_kernel[(token_blocks, split)](
        x, weight, bias, partials, counters, weights, ids, *plan_args,
        t, h, x.stride(0), weight.stride(0), h_per_split, part_rows, *norm_args,
        E=e, K=top_k, BLOCK_T=BLOCK_T, BLOCK_E=block_e, BLOCK_H=h_block, SPLITS=split,
        # fp32 (CPU tests, fp32 models): no silent TF32; bf16 ignores the setting.
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        PLAN=plan is not None, PLAN_BLOCK_M=plan_block_m or 16,
        E_P2=plan_shape.e_p2 if plan_shape else 1, CHUNK=plan_shape.chunk if plan_shape else 1,
        NORM=norm is not None, NORM_ROWS=triton.next_power_of_2(t) if norm is not None else 1,
        PARTS=norm.a.shape[0] if norm is not None and norm.a.dim() == 4 else 1,
        BLOCK_ROW=triton.next_power_of_2(h) if norm is not None else 16, PDL=pdl,
        PREFETCH_LINES=triton.next_power_of_2(prefetch) if prefetch else 0,
        FINISH_T=BLOCK_T if token_blocks > 1 else triton.next_power_of_2(t),
        num_warps=4, launch_pdl=pdl,
    )
    return weights, ids, plan
