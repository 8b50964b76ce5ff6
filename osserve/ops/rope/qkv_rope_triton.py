"""Attention's input at decode in one kernel: the fused q/k/v projection, RoPE on q and k, and
the paged KV-cache write, for T <= linear_triton.MAX_TOKENS tokens.

Unfused, a decode layer runs the small-M projection (linear/small_m_triton.py) and then the RoPE +
cache-write kernel (rope/rope_triton.py): a whole launch, ~2.7 µs of latency, for ~10 KB of work
at batch 1. Here the projection's epilogue does it. A program owns one head's rows (q, k or v),
streamed by the small-M linear's loop (linear_triton.small_m_dot), and splits the [2·HALF, T] result into
its two halves in registers, so that rotate-half (x1' = x1·c − x2·s, x2' = x2·c + x1·s) is
elementwise. H100, 20b batch-1 step profile: 13.9 µs a layer, against 13.1 for the projection
alone plus 2.75 for the RoPE kernel (two [HALF, T] MMAs per K step instead: 16.2).
q heads are rotated into q; k heads rotated and v heads as they are go into the cache at
the token's slot (slot −1: not stored).

The projection's values are rounded to the activations' dtype before the rotation, as the
unfused path's bf16 output is; the rotation is rope_triton's, in float32. An FP8 cache takes e4m3
codes and a scale per (token, head) of those float32 values (attention/kv_format.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from osserve.ops.attention.fp8_triton import scale_args, to_e4m3, token_scale
from osserve.ops.linear.small_m_triton import (
    DEFAULT_CONFIG,
    MAX_TOKENS,
    prefetch_lines,
    small_m_dot,
    stages_that_fit,
)
from osserve.ops.pdl import pdl_enter, pdl_launch, prefetch_rows
from osserve.ops.policy import kernel_policy


@triton.jit
def _qkv_rope_cache_kernel(
    x_ptr, w_ptr, b_ptr, q_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr,
    M, K, stride_xm, stride_wn, stride_qm, stride_qh,
    skc_b, skc_o, skc_h, svc_b, svc_o, svc_h, ss_b, ss_o, ss_h, block_size, table_stride,
    NUM_Q: tl.constexpr, NUM_KV: tl.constexpr, HALF: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr, DOT_PRECISION: tl.constexpr,
    PDL: tl.constexpr, PREFETCH: tl.constexpr, FP8: tl.constexpr,
):  # noqa: ANN001
    head = tl.program_id(0)  # q heads, then k heads, then v heads: the fused weight's row order
    rh = tl.arange(0, HALF)
    rm = tl.arange(0, BLOCK_M)
    m_ok = rm < M
    rows = head * 2 * HALF + tl.arange(0, 2 * HALF)
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
    prefetch_rows(w_rows, w_ptr, rows >= 0, 0, K, PREFETCH)  # a weight: before the wait (ops/pdl.py)
    pdl_enter(PDL)
    # The epilogue's inputs before the K loop, whose weight stream hides their round trips (after it,
    # the positions, then their cos/sin rows, were two on the layer's critical path).
    bias = tl.load(b_ptr + rows).to(tl.float32)
    rotated = head < NUM_Q + NUM_KV  # q and k heads
    head_m = rm * 0 + head  # the head per token column (masks of a vector: the interpreter's too)
    rot_ok = m_ok & (head_m < NUM_Q + NUM_KV)
    pos = tl.load(pos_ptr + rm, mask=rot_ok, other=0).to(tl.int64)
    table = pos[None, :] * table_stride + rh[:, None]
    c = tl.load(cos_ptr + table, mask=rot_ok[None, :], other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + table, mask=rot_ok[None, :], other=0.0).to(tl.float32)
    slot = tl.load(slot_ptr + rm, mask=m_ok & (head_m >= NUM_Q), other=-1).to(tl.int64)
    x_cols = x_ptr + rm[None, :] * stride_xm
    acc = small_m_dot(w_rows, x_cols, rows >= 0, m_ok, 0, K, 2 * HALF, BLOCK_M, BLOCK_K, EVEN_K, NUM_STAGES,
                      DOT_PRECISION)  # every row of a head is real
    dtype = q_ptr.dtype.element_ty
    # + bias, rounded to the activations' dtype: the values the unfused projection writes.
    acc = (acc + bias[:, None]).to(dtype).to(tl.float32)
    # The head's two halves as two [HALF, BLOCK_M] tensors (rows i and HALF + i side by side).
    y1, y2 = tl.split(tl.permute(tl.reshape(acc, [2, HALF, BLOCK_M]), (1, 2, 0)))
    if rotated:
        y1, y2 = y1 * c - y2 * s, y2 * c + y1 * s
    if head < NUM_Q:
        q_dst = q_ptr + rm[None, :] * stride_qm + head * stride_qh + rh[:, None]
        tl.store(q_dst, y1.to(dtype), mask=m_ok[None, :])
        tl.store(q_dst + HALF, y2.to(dtype), mask=m_ok[None, :])
    else:
        ok = (m_ok & (slot >= 0))[None, :]
        blk = slot // block_size
        off = slot % block_size
        if head < NUM_Q + NUM_KV:
            kv_head = head - NUM_Q
            dst = kc_ptr + (blk * skc_b + off * skc_o)[None, :] + kv_head * skc_h + rh[:, None]
            scale_dst = ks_ptr
        else:
            kv_head = head - NUM_Q - NUM_KV
            dst = vc_ptr + (blk * svc_b + off * svc_o)[None, :] + kv_head * svc_h + rh[:, None]
            scale_dst = vs_ptr
        if FP8:  # a scale per token column (attention/kv_format.py)
            sc = token_scale(tl.maximum(tl.max(tl.abs(y1), 0), tl.max(tl.abs(y2), 0)))  # [BLOCK_M]
            tl.store(dst, to_e4m3(y1, sc[None, :]), mask=ok)
            tl.store(dst + HALF, to_e4m3(y2, sc[None, :]), mask=ok)
            tl.store(scale_dst + blk * ss_b + off * ss_o + kv_head * ss_h, sc.to(tl.bfloat16), mask=m_ok & (slot >= 0))
        else:
            tl.store(dst, y1.to(kc_ptr.dtype.element_ty), mask=ok)
            tl.store(dst + HALF, y2.to(kc_ptr.dtype.element_ty), mask=ok)


def fits_qkv_rope(x: torch.Tensor, weight: torch.Tensor, head_dim: int) -> bool:
    """T <= MAX_TOKENS, contiguous rows, and head halves the MMA can take (16 rows or more)."""
    half = head_dim // 2
    return (x.dim() == 2 and 0 < x.shape[0] <= MAX_TOKENS and x.stride(1) == 1 and weight.stride(1) == 1
            and x.dtype == weight.dtype and head_dim % 2 == 0 and half >= 16 and half & (half - 1) == 0)


def qkv_rope_cache_triton(
    x: torch.Tensor,  # [T, hidden]
    weight: torch.Tensor,  # [(H + 2·KVH)·D, hidden]: q, k, v rows (Attention.fuse_qkv)
    bias: torch.Tensor,  # [(H + 2·KVH)·D]
    num_heads: int,
    num_kv_heads: int,
    cos: torch.Tensor,  # [max_positions, D/2] float32 (RopeTable)
    sin: torch.Tensor,
    positions: torch.Tensor,  # [T] int
    k_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D], last dim contiguous
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [T] int64, -1: not stored
    k_scales: torch.Tensor | None = None,  # [num_blocks, block_size, KVH] uint8: an FP8 cache's
    v_scales: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rotated q [T, H, D]; rotated k and v stored at their slots (quantised into an FP8 cache,
    with its scales). As linear + split + rope_and_cache_table (rope.py), up to the projection's
    float32 accumulation order."""
    t, hidden = x.shape
    head_dim = weight.shape[0] // (num_heads + 2 * num_kv_heads)
    assert fits_qkv_rope(x, weight, head_dim), (x.shape, x.stride(), weight.stride(), head_dim)
    assert weight.shape == ((num_heads + 2 * num_kv_heads) * head_dim, hidden) and bias.shape == weight.shape[:1]
    assert k_cache.stride(3) == 1 and v_cache.stride(3) == 1 and cos.stride(1) == 1 and sin.stride() == cos.stride()
    q = torch.empty(t, num_heads, head_dim, dtype=x.dtype, device=x.device)
    config = DEFAULT_CONFIG
    block_m = max(16, triton.next_power_of_2(t))
    pdl = pdl_launch(x.device)
    programs = num_heads + 2 * num_kv_heads
    ks, vs, scale_strides = scale_args(k_scales, v_scales, slot_mapping)
    _qkv_rope_cache_kernel[(programs,)](
        x, weight, bias, q, k_cache, v_cache, ks, vs, cos, sin, positions, slot_mapping,
        t, hidden, x.stride(0), weight.stride(0), q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), *scale_strides, k_cache.shape[1], cos.stride(0),
        NUM_Q=num_heads, NUM_KV=num_kv_heads, HALF=head_dim // 2, EVEN_K=hidden % config.block_k == 0,
        BLOCK_M=block_m, BLOCK_K=config.block_k,
        NUM_STAGES=stages_that_fit(config, block_m, x.element_size(), kernel_policy(x.device).shared_memory),
        # fp32 (CPU tests): no silent TF32; bf16 ignores the setting.
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", PDL=pdl,
        PREFETCH=prefetch_lines(programs, x.device), FP8=k_scales is not None,
        num_warps=config.num_warps, launch_pdl=pdl,
    )
    return q
