"""Fused MoE on MXFP4 experts in Triton: weights stay 4-bit in memory, dequantised in registers.

Pipeline for x [T, H], topk_ids [T, k] (slot s = t*k + j):
  1. align_tokens: slots grouped by expert into BLOCK_M-padded segments (ops/moe/plan.py).
  2. _gate_up_kernel: per tile, gather the token rows of x, multiply by the expert's gate and up
     weights (de-interleaved at load time so a program owns matching gate/up columns), add the
     bias and apply the clamped SwiGLU in the epilogue -> act [max_padded, I] in sorted order.
  3. _down_kernel: act tile x down weights + bias, times the slot's router weight, stored at
     row s of y [T*k, H] (each slot written exactly once, no zero-init).
  4. out = y.view(T, k, H).sum(1): the k-way reduction as a separate small sum rather than
     atomics: deterministic, works in bf16 (no fp32 staging buffer + cast), and costs
     T*k*H*2 bytes each way, noise next to the weight traffic.

The portable path for batches above swapped.MAX_TOKENS where the dense path has no
checkpoint-layout weights to read (a GPU without the Gluon kernel whose memory cannot hold both
layouts, e.g. the 120b on an 80 GB Ampere card): dispatch.py picks it there and nowhere else.
Weights in layout.py's Triton layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from osserve.ops.moe.dequant_triton import dequant, packed_dequant, swiglu
from osserve.ops.moe.plan import RoutingPlan, align_tokens
from osserve.ops.moe.weights import SWIGLU_ALPHA, UNSCALE, PreparedExperts

_empty = torch.empty  # one seam for tests to poison fresh buffers


@dataclass(frozen=True)
class MoEConfig:
    block_m: int  # rows per tile (shared by both GEMMs: the routing plan is padded to it)
    block_n1: int  # activation columns per program in GEMM1 (it loads 2x that many weight rows)
    block_k1: int
    warps1: int
    stages1: int
    block_n2: int
    block_k2: int
    warps2: int
    stages2: int


# Keyed by the largest token count of the bucket. Decode (<= 64 tokens): each expert sees a few
# rows, the GEMMs are GEMVs over 4-bit weights, so small BLOCK_M and many programs over N.
# Prefill: tensor-core tiles. Chosen on an H100 (NOTES-moe.md).
CONFIGS: dict[int, MoEConfig] = {
    16: MoEConfig(16, 32, 128, 4, 4, 32, 128, 4, 4),
    64: MoEConfig(16, 64, 128, 4, 3, 64, 128, 4, 3),
    512: MoEConfig(32, 64, 128, 4, 3, 64, 128, 4, 3),
    1 << 62: MoEConfig(128, 64, 64, 8, 3, 128, 64, 8, 3),
}


def pick_config(num_tokens: int) -> MoEConfig:
    for bound in sorted(CONFIGS):
        if num_tokens <= bound:
            return CONFIGS[bound]
    raise AssertionError("unreachable: the last bucket is unbounded")


@triton.jit
def _gate_up_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, act_ptr,  # x [T, K]; w [E, 2N, K/2]; s [E, 2N, K/32]; b [E, 2N]; act [P, N]
    sorted_ptr, block_expert_ptr, num_padded_ptr,
    num_slots, N, K, num_m_blocks, limit,
    stride_xm, stride_we, stride_wn, stride_se, stride_sn, stride_sk, stride_be, stride_am,
    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, ALPHA: tl.constexpr, UNSCALE: tl.constexpr, FAST: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_m = pid % num_m_blocks  # M fastest: neighbouring programs share a weight tile (L2 reuse)
    pid_n = pid // num_m_blocks
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slot = tl.load(sorted_ptr + rows)
    row_ok = slot < num_slots
    token = (slot // TOP_K).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    byte = tl.arange(0, BLOCK_K // 2)  # byte j of a 16-byte group: values j and j+16
    kcol = (byte // 16) * 32 + byte % 16  # activation column of each low nibble
    a_ptrs = x_ptr + token[:, None] * stride_xm + kcol[None, :]  # [BM, BK/2]
    wg_ptrs = w_ptr + expert * stride_we + cols[:, None] * stride_wn + byte[None, :]  # [BN, BK/2]
    sg_ptrs = s_ptr + expert * stride_se + cols[:, None] * stride_sn + (byte // 16)[None, :] * stride_sk
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            k_ok = kcol < BLOCK_K  # all true; keeps the masks' shapes uniform
        else:
            k_ok = k0 + kcol < K
        a_mask = row_ok[:, None] & k_ok[None, :]
        w_mask = col_ok[:, None] & k_ok[None, :]
        a_lo = tl.load(a_ptrs + k0, mask=a_mask, other=0.0)
        a_hi = tl.load(a_ptrs + k0 + 16, mask=a_mask, other=0.0)
        wg = tl.load(wg_ptrs + k0 // 2, mask=w_mask, other=0)
        wu = tl.load(wg_ptrs + N * stride_wn + k0 // 2, mask=w_mask, other=0)
        sg = tl.load(sg_ptrs + (k0 // 32) * stride_sk, mask=w_mask, other=0)
        su = tl.load(sg_ptrs + N * stride_sn + (k0 // 32) * stride_sk, mask=w_mask, other=0)
        g_lo, g_hi = dequant(wg, sg, a_lo.dtype, FAST)
        u_lo, u_hi = dequant(wu, su, a_lo.dtype, FAST)
        acc_g = tl.dot(a_lo, tl.trans(g_lo), acc_g)
        acc_g = tl.dot(a_hi, tl.trans(g_hi), acc_g)
        acc_u = tl.dot(a_lo, tl.trans(u_lo), acc_u)
        acc_u = tl.dot(a_hi, tl.trans(u_hi), acc_u)
    acc_g = acc_g * UNSCALE
    acc_u = acc_u * UNSCALE
    bg = tl.load(b_ptr + expert * stride_be + cols, mask=col_ok, other=0.0)
    bu = tl.load(b_ptr + expert * stride_be + N + cols, mask=col_ok, other=0.0)
    h = swiglu(acc_g + bg[None, :], acc_u + bu[None, :], limit, ALPHA)
    a_out = act_ptr + rows[:, None].to(tl.int64) * stride_am + cols[None, :]
    tl.store(a_out, h.to(act_ptr.dtype.element_ty), mask=col_ok[None, :])


@triton.jit
def _down_kernel(
    act_ptr, w_ptr, s_ptr, b_ptr, y_ptr, topk_w_ptr,  # act [P, K]; w [E, N, K/2]; y [T*k, N]
    sorted_ptr, block_expert_ptr, num_padded_ptr,
    num_slots, N, K, num_m_blocks,
    stride_am, stride_we, stride_wn, stride_se, stride_sn, stride_sk, stride_be, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    UNSCALE: tl.constexpr, FAST: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_m = pid % num_m_blocks
    pid_n = pid // num_m_blocks
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slot = tl.load(sorted_ptr + rows)
    row_ok = slot < num_slots
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    byte = tl.arange(0, BLOCK_K // 2)
    kcol = (byte // 16) * 32 + byte % 16
    a_ptrs = act_ptr + rows[:, None].to(tl.int64) * stride_am + kcol[None, :]  # rows in sorted order
    w_ptrs = w_ptr + expert * stride_we + cols[:, None] * stride_wn + byte[None, :]
    s_ptrs = s_ptr + expert * stride_se + cols[:, None] * stride_sn + (byte // 16)[None, :] * stride_sk
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            k_ok = kcol < BLOCK_K
        else:
            k_ok = k0 + kcol < K
        a_lo = tl.load(a_ptrs + k0, mask=k_ok[None, :], other=0.0)
        a_hi = tl.load(a_ptrs + k0 + 16, mask=k_ok[None, :], other=0.0)
        w_mask = col_ok[:, None] & k_ok[None, :]
        w = tl.load(w_ptrs + k0 // 2, mask=w_mask, other=0)
        s = tl.load(s_ptrs + (k0 // 32) * stride_sk, mask=w_mask, other=0)
        w_lo, w_hi = dequant(w, s, a_lo.dtype, FAST)
        acc = tl.dot(a_lo, tl.trans(w_lo), acc)
        acc = tl.dot(a_hi, tl.trans(w_hi), acc)
    bias = tl.load(b_ptr + expert * stride_be + cols, mask=col_ok, other=0.0)
    gate_w = tl.load(topk_w_ptr + slot, mask=row_ok, other=0.0).to(tl.float32)
    out = (acc * UNSCALE + bias[None, :]) * gate_w[:, None]
    y_ptrs = y_ptr + slot[:, None].to(tl.int64) * stride_ym + cols[None, :]
    tl.store(y_ptrs, out.to(y_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def fused_moe_triton(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    prepared: PreparedExperts,
    swiglu_limit: float,
    config: MoEConfig | None = None,
    fast_dequant: bool = False,
) -> torch.Tensor:
    """x [T, H] -> [T, H]; same function as moe_reference. Host-sync free, CUDA-graph capturable."""
    num_tokens, hidden = x.shape
    top_k = topk_ids.shape[1]
    inter = prepared.intermediate
    cfg = config or pick_config(num_tokens)
    fast = packed_dequant(fast_dequant, x)  # off by default here (slower)
    x = x.contiguous()
    topk_w = topk_weights.reshape(-1).contiguous()  # [T*k]
    plan: RoutingPlan = align_tokens(topk_ids, prepared.num_experts, cfg.block_m)
    act = _empty(plan.sorted_slots.shape[0], inter, dtype=x.dtype, device=x.device)  # [P, I]
    y = _empty(num_tokens * top_k, hidden, dtype=x.dtype, device=x.device)  # [T*k, H]
    w1, s1, b1 = prepared.w1, prepared.s1, prepared.b1
    w2, s2, b2 = prepared.w2, prepared.s2, prepared.b2
    mb = plan.max_blocks
    _gate_up_kernel[(mb * triton.cdiv(inter, cfg.block_n1),)](
        x, w1, s1, b1, act, plan.sorted_slots, plan.block_expert, plan.num_padded,
        num_tokens * top_k, inter, hidden, mb, float(swiglu_limit),
        x.stride(0), w1.stride(0), w1.stride(1), s1.stride(0), s1.stride(1), s1.stride(2), b1.stride(0), act.stride(0),
        TOP_K=top_k, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n1, BLOCK_K=cfg.block_k1,
        EVEN_K=hidden % cfg.block_k1 == 0, ALPHA=SWIGLU_ALPHA, UNSCALE=UNSCALE, FAST=fast,
        num_warps=cfg.warps1, num_stages=cfg.stages1,
    )
    _down_kernel[(mb * triton.cdiv(hidden, cfg.block_n2),)](
        act, w2, s2, b2, y, topk_w, plan.sorted_slots, plan.block_expert, plan.num_padded,
        num_tokens * top_k, hidden, inter, mb,
        act.stride(0), w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1), s2.stride(2), b2.stride(0), y.stride(0),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n2, BLOCK_K=cfg.block_k2,
        EVEN_K=inter % cfg.block_k2 == 0, UNSCALE=UNSCALE, FAST=fast,
        num_warps=cfg.warps2, num_stages=cfg.stages2,
    )
    return y.view(num_tokens, top_k, hidden).sum(dim=1)
