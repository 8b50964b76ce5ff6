"""Fused MXFP4 MoE for batches up to 4096 tokens: the weights are the left operand (W @ X^T).

moe/tiled.py tiles each expert's GEMM as X [tokens, K] @ W^T: a tile holds BLOCK_M token rows,
so at decode (one to a few tokens per expert) 16 rows are computed for every real one, and the
dequantised weights must be moved into the dot's right-operand layout through shared memory.
Here the roles are swapped: a program owns BLOCK_W weight rows (the dot's M, 64 feeds one Hopper
warpgroup MMA) and BLOCK_T token slots (the dot's N, as small as 16), so the 4-bit weights are
dequantised in registers straight into the left operand and each weight byte is read once per
BLOCK_T slots. When a batch hits few experts (batch 1: 4 experts, ~180 programs per GEMM) K is
split so that enough loads are in flight; float32 partial sums are added in a small SwiGLU
kernel (GEMM1) and in the final sum over the k experts (GEMM2). Same routing plan (moe/plan.py),
same weight layout (PreparedExperts), same function as moe_reference.

The dequantiser is moe/tiled.py's (bit placement, or its inline PTX with FAST); Triton's own
`tl.dot_scaled` (e2m1 x bf16) computes the same function but measured 1.2-2x slower in every
configuration tried on the H100 (NOTES-moe.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

import torch
import triton
import triton.language as tl

from osserve.ops.moe.dequant_triton import dequant, packed_dequant, swiglu
from osserve.ops.moe.plan import RoutingPlan, align_tokens
from osserve.ops.moe.weights import SWIGLU_ALPHA, UNSCALE, PreparedExperts

_empty = torch.empty  # one seam for tests to poison fresh buffers
T = TypeVar("T")


@dataclass(frozen=True)
class SwappedConfig:
    block_t: int  # token slots per tile (the dot's N); the routing plan is padded to it
    block_w1: int  # gate (and as many up) weight rows per program in GEMM1
    block_k1: int
    warps1: int
    stages1: int
    block_w2: int  # hidden rows per program in GEMM2
    block_k2: int
    warps2: int
    stages2: int
    fast_dequant: bool = False  # the inline-PTX dequantiser (moe/dequant_triton.py), where the policy allows


# Keyed by the most token slots an expert gets on average (T * top_k / E): the token tile follows
# them, so that a tile is about one expert's share (the 20b at T=256 has 32 slots per expert, the
# 120b 8). Chosen on an H100 with benchmarks/bench_moe_decode.py (NOTES-moe.md).
CONFIGS: dict[int, SwappedConfig] = {
    8: SwappedConfig(16, 64, 128, 4, 3, 64, 128, 4, 3, True),
    16: SwappedConfig(32, 64, 128, 4, 3, 64, 128, 4, 3, True),
    1 << 30: SwappedConfig(64, 64, 128, 4, 3, 64, 128, 4, 3, True),
}
MAX_TOKENS = 4096  # above, fused_moe (moe.py) takes the dense path or moe/tiled.py's token-tiled kernel
PROGRAMS_PER_SM = 2  # split K below this many programs per GEMM (split_k); 2 was best at batch 1
SWIGLU_BLOCK_N = 256


def by_slots(table: dict[int, T], num_tokens: int, num_experts: int, top_k: int) -> T:
    """The entry of `table` (keyed by upper bounds) for the token slots an expert gets on average."""
    slots_per_expert = num_tokens * top_k / num_experts
    return table[min(bound for bound in table if slots_per_expert <= bound)]


def pick_config(num_tokens: int, num_experts: int, top_k: int) -> SwappedConfig:
    return by_slots(CONFIGS, num_tokens, num_experts, top_k)


@triton.jit
def _mxfp4_dot(acc, w, s, a_lo, a_hi, BLOCK_W: tl.constexpr, BLOCK_K: tl.constexpr, FAST: tl.constexpr):
    """acc [BW, BT] += dequant(w [BW, BK/2] uint8, s [BW, BK/32] uint8) @ activations^T [BK, BT].

    In the prepared layout byte j of a 32-value group holds values j (low nibble) and j+16 (high):
    a_lo [BK/2, BT] holds the low nibbles' activation columns, a_hi the high ones' (16 further)."""
    s_full = tl.reshape(tl.broadcast_to(s[:, :, None], (BLOCK_W, BLOCK_K // 32, 16)), (BLOCK_W, BLOCK_K // 2))
    lo, hi = dequant(w, s_full, a_lo.dtype, FAST)
    acc = tl.dot(lo, a_lo, acc)
    return tl.dot(hi, a_hi, acc)


@triton.jit
def _load_scales(row_ptrs, k0, k_end, w_ok, group, stride_sk):
    """The [BW, BK/32] scales of the K step at k0 (zero past k_end). Loaded a step ahead of their
    use: the pipeliner does not stage these (they reach the dot through the dequantiser, not as
    an operand), so a load in the step that uses them would stall every step on its latency."""
    mask = w_ok[:, None] & (k0 + group * 32 < k_end)[None, :]
    return tl.load(row_ptrs + (k0 // 32 + group)[None, :] * stride_sk, mask=mask, other=0)


@triton.jit
def _tile_setup(sorted_ptr, block_expert_ptr, pid_t, num_slots, BLOCK_T: tl.constexpr):
    """A program's expert, its BLOCK_T rows of the plan, their slots and which of those are real."""
    expert = tl.load(block_expert_ptr + pid_t).to(tl.int64)
    rows = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    slot = tl.load(sorted_ptr + rows)
    return expert, rows, slot, slot < num_slots


# The token-count arguments vary step to step: unspecialised, so a new batch size in a serving run
# never recompiles (Triton otherwise specialises integers on divisibility by 16, and 1).
_PER_STEP = ["num_slots", "num_t_blocks", "num_splits"]


@triton.jit(do_not_specialize=_PER_STEP)
def _gate_up_swapped_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, act_ptr, part_ptr,  # x [T, K]; w [E, 2N, K/2]; s [E, 2N, K/32]; b [E, 2N]
    sorted_ptr, block_expert_ptr, num_padded_ptr,   # act [P, N]; part [S, P, 2N] float32 (split K only)
    num_slots, N, K, num_t_blocks, num_splits, k_per_split, limit,
    stride_xm, stride_we, stride_wn, stride_se, stride_sn, stride_sk, stride_be, stride_am, stride_ps, stride_pm,
    TOP_K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr, ALPHA: tl.constexpr, UNSCALE: tl.constexpr, FAST: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_t = pid % num_t_blocks  # token tiles fastest: neighbours share a weight tile (L2 reuse)
    pid_s = (pid // num_t_blocks) % num_splits
    pid_w = pid // (num_t_blocks * num_splits)
    if pid_t * BLOCK_T >= tl.load(num_padded_ptr):
        return
    expert, rows, slot, row_ok = _tile_setup(sorted_ptr, block_expert_ptr, pid_t, num_slots, BLOCK_T)
    token = (slot // TOP_K).to(tl.int64)
    wrows = pid_w * BLOCK_W + tl.arange(0, BLOCK_W)
    w_ok = wrows < N
    byte = tl.arange(0, BLOCK_K // 2)
    group = tl.arange(0, BLOCK_K // 32)
    col = (byte // 16) * 32 + byte % 16  # activation column of each low nibble
    a_ptrs = x_ptr + token[None, :] * stride_xm + col[:, None]  # [BK/2, BT]
    wg_ptrs = w_ptr + expert * stride_we + wrows[:, None] * stride_wn + byte[None, :]
    sg_ptrs = s_ptr + expert * stride_se + wrows[:, None] * stride_sn
    acc_g = tl.zeros([BLOCK_W, BLOCK_T], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_W, BLOCK_T], dtype=tl.float32)
    k_start = pid_s * k_per_split
    k_end = tl.minimum(K, k_start + k_per_split)
    sg_next = _load_scales(sg_ptrs, k_start, k_end, w_ok, group, stride_sk)
    su_next = _load_scales(sg_ptrs + N * stride_sn, k_start, k_end, w_ok, group, stride_sk)
    for k0 in range(k_start, k_end, BLOCK_K):
        # K is a multiple of 32 (MXFP4 groups), so each 32-value group is wholly in or out.
        a_mask = (k0 + col < k_end)[:, None] & row_ok[None, :]
        w_mask = w_ok[:, None] & (k0 + (byte // 16) * 32 < k_end)[None, :]
        wg = tl.load(wg_ptrs + k0 // 2, mask=w_mask, other=0)
        wu = tl.load(wg_ptrs + N * stride_wn + k0 // 2, mask=w_mask, other=0)
        sg = sg_next
        su = su_next
        sg_next = _load_scales(sg_ptrs, k0 + BLOCK_K, k_end, w_ok, group, stride_sk)
        su_next = _load_scales(sg_ptrs + N * stride_sn, k0 + BLOCK_K, k_end, w_ok, group, stride_sk)
        a_lo = tl.load(a_ptrs + k0, mask=a_mask, other=0.0)
        a_hi = tl.load(a_ptrs + k0 + 16, mask=a_mask, other=0.0)
        acc_g = _mxfp4_dot(acc_g, wg, sg, a_lo, a_hi, BLOCK_W, BLOCK_K, FAST)
        acc_u = _mxfp4_dot(acc_u, wu, su, a_lo, a_hi, BLOCK_W, BLOCK_K, FAST)
    acc_g = acc_g * UNSCALE
    acc_u = acc_u * UNSCALE
    if SPLIT:  # partial sums; _swiglu_splits_kernel adds them up and applies the epilogue
        p_ptrs = part_ptr + pid_s.to(tl.int64) * stride_ps + rows[None, :].to(tl.int64) * stride_pm + wrows[:, None]
        p_mask = w_ok[:, None] & row_ok[None, :]
        tl.store(p_ptrs, acc_g, mask=p_mask)
        tl.store(p_ptrs + N, acc_u, mask=p_mask)
    else:
        bg = tl.load(b_ptr + expert * stride_be + wrows, mask=w_ok, other=0.0)
        bu = tl.load(b_ptr + expert * stride_be + N + wrows, mask=w_ok, other=0.0)
        h = swiglu(acc_g + bg[:, None], acc_u + bu[:, None], limit, ALPHA)  # [BW, BT]
        a_out = act_ptr + rows[None, :].to(tl.int64) * stride_am + wrows[:, None]
        tl.store(a_out, h.to(act_ptr.dtype.element_ty), mask=w_ok[:, None])


@triton.jit(do_not_specialize=["num_slots", "num_splits"])
def _swiglu_splits_kernel(
    part_ptr, b_ptr, act_ptr,  # part [S, P, 2N] float32; b [E, 2N]; act [P, N]
    sorted_ptr, block_expert_ptr, num_padded_ptr,
    num_slots, N, num_splits, limit, stride_ps, stride_pm, stride_be, stride_am,
    BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, ALPHA: tl.constexpr,
):
    pid_t = tl.program_id(0)
    if pid_t * BLOCK_T >= tl.load(num_padded_ptr):
        return
    expert, rows, slot, row_ok = _tile_setup(sorted_ptr, block_expert_ptr, pid_t, num_slots, BLOCK_T)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    mask = row_ok[:, None] & col_ok[None, :]
    p_ptrs = part_ptr + rows[:, None].to(tl.int64) * stride_pm + cols[None, :]
    zero = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)  # the loop carries full tiles
    gate = zero + tl.load(b_ptr + expert * stride_be + cols, mask=col_ok, other=0.0)[None, :]
    up = zero + tl.load(b_ptr + expert * stride_be + N + cols, mask=col_ok, other=0.0)[None, :]
    for s in range(num_splits):
        gate += tl.load(p_ptrs + s * stride_ps.to(tl.int64), mask=mask, other=0.0)
        up += tl.load(p_ptrs + s * stride_ps.to(tl.int64) + N, mask=mask, other=0.0)
    h = swiglu(gate, up, limit, ALPHA)
    a_out = act_ptr + rows[:, None].to(tl.int64) * stride_am + cols[None, :]
    tl.store(a_out, h.to(act_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=_PER_STEP)
def _down_swapped_kernel(
    act_ptr, w_ptr, s_ptr, b_ptr, y_ptr, topk_w_ptr,  # act [P, K]; w [E, N, K/2]; y [S, T*k, N]
    sorted_ptr, block_expert_ptr, num_padded_ptr,
    num_slots, N, K, num_t_blocks, num_splits, k_per_split,
    stride_am, stride_we, stride_wn, stride_se, stride_sn, stride_sk, stride_be, stride_ys, stride_ym,
    BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_K: tl.constexpr,
    UNSCALE: tl.constexpr, FAST: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_t = pid % num_t_blocks
    pid_s = (pid // num_t_blocks) % num_splits
    pid_w = pid // (num_t_blocks * num_splits)
    if pid_t * BLOCK_T >= tl.load(num_padded_ptr):
        return
    expert, rows, slot, row_ok = _tile_setup(sorted_ptr, block_expert_ptr, pid_t, num_slots, BLOCK_T)
    wrows = pid_w * BLOCK_W + tl.arange(0, BLOCK_W)
    w_ok = wrows < N
    byte = tl.arange(0, BLOCK_K // 2)
    group = tl.arange(0, BLOCK_K // 32)
    col = (byte // 16) * 32 + byte % 16  # activation column of each low nibble
    a_ptrs = act_ptr + rows[None, :].to(tl.int64) * stride_am + col[:, None]  # rows in sorted order
    w_ptrs = w_ptr + expert * stride_we + wrows[:, None] * stride_wn + byte[None, :]
    s_ptrs = s_ptr + expert * stride_se + wrows[:, None] * stride_sn
    acc = tl.zeros([BLOCK_W, BLOCK_T], dtype=tl.float32)
    k_start = pid_s * k_per_split
    k_end = tl.minimum(K, k_start + k_per_split)
    s_next = _load_scales(s_ptrs, k_start, k_end, w_ok, group, stride_sk)
    for k0 in range(k_start, k_end, BLOCK_K):
        a_mask = (k0 + col < k_end)[:, None] & row_ok[None, :]
        w_mask = w_ok[:, None] & (k0 + (byte // 16) * 32 < k_end)[None, :]
        w = tl.load(w_ptrs + k0 // 2, mask=w_mask, other=0)
        s = s_next
        s_next = _load_scales(s_ptrs, k0 + BLOCK_K, k_end, w_ok, group, stride_sk)
        a_lo = tl.load(a_ptrs + k0, mask=a_mask, other=0.0)
        a_hi = tl.load(a_ptrs + k0 + 16, mask=a_mask, other=0.0)
        acc = _mxfp4_dot(acc, w, s, a_lo, a_hi, BLOCK_W, BLOCK_K, FAST)
    bias = tl.load(b_ptr + expert * stride_be + wrows, mask=w_ok, other=0.0)
    bias = tl.where(pid_s == 0, bias, 0.0)  # added by the first split only
    gate_w = tl.load(topk_w_ptr + slot, mask=row_ok, other=0.0).to(tl.float32)
    out = (acc * UNSCALE + bias[:, None]) * gate_w[None, :]
    y_ptrs = y_ptr + pid_s.to(tl.int64) * stride_ys + slot[None, :].to(tl.int64) * stride_ym + wrows[:, None]
    tl.store(y_ptrs, out.to(y_ptr.dtype.element_ty), mask=w_ok[:, None] & row_ok[None, :])


def split_k(num_programs: int, k: int, block_k: int, min_programs: int) -> tuple[int, int]:
    """(splits, K per split): split K until the grid has about `min_programs` programs.

    At batch 1 a layer's 4 experts give one GEMM only ~180 programs of 23 K-steps each, too few to
    keep enough loads in flight on 132 SMs; each split is a multiple of BLOCK_K."""
    steps = triton.cdiv(k, block_k)
    splits = max(1, min(steps, triton.cdiv(min_programs, num_programs)))
    per_split = triton.cdiv(steps, splits) * block_k
    return triton.cdiv(k, per_split), per_split


def used_tiles(plan: RoutingPlan, num_slots: int, block_t: int, num_experts: int) -> int:
    """Token tiles that do work: those of the experts hit (at most min(slots, E) partial ones),
    not the plan's bound. Sizes the split of K."""
    return min(plan.max_blocks, triton.cdiv(num_slots, block_t) + min(num_slots, num_experts))


def down_output(splits: int, num_slots: int, hidden: int, x: torch.Tensor) -> torch.Tensor:
    """GEMM2's output [splits, T*k, H]: split partial sums stay float32 until sum_experts."""
    return _empty(splits, num_slots, hidden, dtype=x.dtype if splits == 1 else torch.float32, device=x.device)


@triton.jit(do_not_specialize=["num_splits"])
def _sum_experts_kernel(y_ptr, out_ptr, hidden, num_splits, stride_ys, stride_ym,
                        TOP_K: tl.constexpr, BLOCK_H: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    ok = cols < hidden
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for s in range(num_splits):
        for j in tl.static_range(TOP_K):
            row = y_ptr + s * stride_ys + (token * TOP_K + j) * stride_ym
            acc += tl.load(row + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + token * hidden + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)


SUM_BLOCK_H = 1024


def sum_experts(y: torch.Tensor, num_tokens: int, top_k: int, dtype: torch.dtype) -> torch.Tensor:
    """[splits, T*k, H] -> [T, H]: the sum over K splits and each token's k experts, in float32,
    rounded once. One launch: PyTorch's sum and cast took two, 5.4 us at batch 1 (H100,
    bench_moe_gluon.py --profile)."""
    splits, _, hidden = y.shape
    out = torch.empty(num_tokens, hidden, dtype=dtype, device=y.device)
    if num_tokens == 0:
        return out
    _sum_experts_kernel[(num_tokens, triton.cdiv(hidden, SUM_BLOCK_H))](
        y, out, hidden, splits, y.stride(0), y.stride(1), TOP_K=top_k, BLOCK_H=SUM_BLOCK_H)
    return out


def expert_rows(y: torch.Tensor, num_tokens: int, top_k: int, dtype: torch.dtype, reduce: bool) -> torch.Tensor:
    """GEMM2's output as the MoE returns it: summed to [T, H] (sum_experts), or with reduce=False
    the unreduced view [S, T, k, H] that ops/norm/reference.py's add_rms_norm sums (one launch fewer)."""
    if reduce:
        return sum_experts(y, num_tokens, top_k, dtype)
    return y.view(y.shape[0], num_tokens, top_k, y.shape[2])


def fused_moe_swapped(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    prepared: PreparedExperts,
    swiglu_limit: float,
    config: SwappedConfig | None = None,
    min_programs: int | None = None,
    reduce: bool = True,
) -> torch.Tensor:
    """x [T, H] -> [T, H] (or unreduced, see expert_rows); same function as moe_reference.
    Host-sync free, CUDA-graph capturable.

    min_programs: split K until each GEMM's grid has this many programs (default PROGRAMS_PER_SM
    per SM)."""
    num_tokens, hidden = x.shape
    top_k = topk_ids.shape[1]
    num_slots = num_tokens * top_k
    inter = prepared.intermediate
    cfg = config or pick_config(num_tokens, prepared.num_experts, top_k)
    if min_programs is None:
        min_programs = PROGRAMS_PER_SM * torch.cuda.get_device_properties(x.device).multi_processor_count \
            if x.is_cuda else 1
    fast = packed_dequant(cfg.fast_dequant, x)
    x = x.contiguous()
    topk_w = topk_weights.reshape(-1).contiguous()  # [T*k]
    plan: RoutingPlan = align_tokens(topk_ids, prepared.num_experts, cfg.block_t)
    rows = plan.sorted_slots.shape[0]
    act = _empty(rows, inter, dtype=x.dtype, device=x.device)  # [P, I]
    w1, s1, b1 = prepared.w1, prepared.s1, prepared.b1
    w2, s2, b2 = prepared.w2, prepared.s2, prepared.b2
    tb = plan.max_blocks
    used_t_blocks = used_tiles(plan, num_slots, cfg.block_t, prepared.num_experts)
    w_blocks1 = triton.cdiv(inter, cfg.block_w1)
    splits1, per_split1 = split_k(used_t_blocks * w_blocks1, hidden, cfg.block_k1, min_programs)
    part = _empty(splits1, rows, 2 * inter, dtype=torch.float32, device=x.device) if splits1 > 1 else act
    _gate_up_swapped_kernel[(tb * splits1 * w_blocks1,)](
        x, w1, s1, b1, act, part, plan.sorted_slots, plan.block_expert, plan.num_padded,
        num_slots, inter, hidden, tb, splits1, per_split1, float(swiglu_limit),
        x.stride(0), w1.stride(0), w1.stride(1), s1.stride(0), s1.stride(1), s1.stride(2), b1.stride(0), act.stride(0),
        part.stride(0), part.stride(1),
        TOP_K=top_k, BLOCK_T=cfg.block_t, BLOCK_W=cfg.block_w1, BLOCK_K=cfg.block_k1, SPLIT=splits1 > 1,
        ALPHA=SWIGLU_ALPHA, UNSCALE=UNSCALE, FAST=fast,
        num_warps=cfg.warps1, num_stages=cfg.stages1,
    )
    if splits1 > 1:
        _swiglu_splits_kernel[(tb, triton.cdiv(inter, SWIGLU_BLOCK_N))](
            part, b1, act, plan.sorted_slots, plan.block_expert, plan.num_padded,
            num_slots, inter, splits1, float(swiglu_limit), part.stride(0), part.stride(1), b1.stride(0),
            act.stride(0), BLOCK_T=cfg.block_t, BLOCK_N=SWIGLU_BLOCK_N, ALPHA=SWIGLU_ALPHA,
        )
    w_blocks2 = triton.cdiv(hidden, cfg.block_w2)
    splits2, per_split2 = split_k(used_t_blocks * w_blocks2, inter, cfg.block_k2, min_programs)
    y = down_output(splits2, num_slots, hidden, x)
    _down_swapped_kernel[(tb * splits2 * w_blocks2,)](
        act, w2, s2, b2, y, topk_w, plan.sorted_slots, plan.block_expert, plan.num_padded,
        num_slots, hidden, inter, tb, splits2, per_split2,
        act.stride(0), w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1), s2.stride(2), b2.stride(0), y.stride(0),
        y.stride(1), BLOCK_T=cfg.block_t, BLOCK_W=cfg.block_w2, BLOCK_K=cfg.block_k2,
        UNSCALE=UNSCALE, FAST=fast,
        num_warps=cfg.warps2, num_stages=cfg.stages2,
    )
    return expert_rows(y, num_tokens, top_k, x.dtype, reduce)


def compile_kernels(
    prepared: PreparedExperts,
    top_k: int,
    swiglu_limit: float,
    dtype: torch.dtype,
    moe: Callable[..., torch.Tensor] = fused_moe_swapped,
    slot_bounds: Iterable[int] = CONFIGS,
) -> None:
    """Run each configuration once (batch 1 with split K, then each slot bucket's largest batch up
    to MAX_TOKENS), so that no serving step waits seconds for a compile it meets first. `moe` and
    its slot buckets: this file's kernel by default, moe/gluon.py's with its own."""
    device = prepared.w1.device
    rng = torch.Generator(device).manual_seed(0)  # leaves the global generator's stream alone
    largest = [min(MAX_TOKENS, bound * prepared.num_experts // top_k) for bound in slot_bounds]
    for num_tokens in sorted({1, *largest}):
        x = torch.randn(num_tokens, prepared.hidden, device=device, dtype=dtype, generator=rng)
        ids = torch.randint(0, prepared.num_experts, (num_tokens, top_k), device=device, generator=rng)
        weights = torch.full((num_tokens, top_k), 1.0 / top_k, device=device, dtype=dtype)
        moe(x, weights, ids, prepared, swiglu_limit)
