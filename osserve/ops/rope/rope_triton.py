"""RoPE on q and k plus the paged KV-cache write, in one kernel (one program per token).

Each program reads its token's cos/sin row (from a per-step [T, D/2] table, or gathered from the
load-time `RopeTable` [max_positions, D/2] by position), rotates all q heads and k heads in fp32
(rotate-half: x1' = x1·c − x2·s, x2' = x2·c + x1·s), writes the rotated q and k, and stores the
rotated k and the untouched v at the token's cache slot (slot −1: not stored). This replaces the
unfused sequence cos/sin gather → 2× apply_rope (≈6 elementwise kernels each) → index_copy ×2.
An FP8 cache takes e4m3 codes and a scale per head, from the rotated k in float32
(attention/kv_format.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from osserve.ops.attention.fp8_triton import scale_args, to_e4m3, token_scale


@triton.jit
def _rotate_heads(src_ptr, dst_ptr, src_tok, dst_tok, src_head, dst_head, c, s,
                  NUM_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_HEADS: tl.constexpr,
                  BLOCK_HALF: tl.constexpr):  # noqa: ANN001
    """Rotate one token's [NUM_HEADS, 2·HALF] heads; returns both rotated halves (fp32) and mask."""
    heads = tl.arange(0, BLOCK_HEADS)[:, None]
    cols = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (heads < NUM_HEADS) & (cols < HALF)
    src = src_ptr + src_tok + heads * src_head + cols
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    y1 = x1 * c - x2 * s
    y2 = x2 * c + x1 * s
    dst = dst_ptr + dst_tok + heads * dst_head + cols
    tl.store(dst, y1.to(dst_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, y2.to(dst_ptr.dtype.element_ty), mask=mask)
    return y1, y2, mask


@triton.jit
def _rope_cache_kernel(
    q_ptr, k_ptr, v_ptr, q_out_ptr, k_out_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr,
    kc_ptr, vc_ptr, ks_ptr, vs_ptr,
    sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sqo_t, sqo_h, sko_t, sko_h,  # token / head strides
    skc_b, skc_o, skc_h, svc_b, svc_o, svc_h,  # cache strides: block, offset in block, head
    ss_b, ss_o, ss_h,  # FP8: the scales' strides (K's and V's alike)
    block_size, table_stride,
    NUM_Q: tl.constexpr, NUM_KV: tl.constexpr, HALF: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_KV: tl.constexpr, BLOCK_HALF: tl.constexpr,
    GATHER: tl.constexpr, FP8: tl.constexpr,
):  # noqa: ANN001
    tok = tl.program_id(0).to(tl.int64)
    # GATHER: the cos/sin row is the token's position in the load-time table; else row = token.
    if GATHER:
        row = tl.load(pos_ptr + tok).to(tl.int64)
    else:
        row = tok
    cols = tl.arange(0, BLOCK_HALF)[None, :]
    c = tl.load(cos_ptr + row * table_stride + cols, mask=cols < HALF, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + row * table_stride + cols, mask=cols < HALF, other=0.0).to(tl.float32)

    _rotate_heads(q_ptr, q_out_ptr, tok * sq_t, tok * sqo_t, sq_h, sqo_h, c, s,
                  NUM_Q, HALF, BLOCK_Q, BLOCK_HALF)
    k1, k2, kmask = _rotate_heads(k_ptr, k_out_ptr, tok * sk_t, tok * sko_t, sk_h, sko_h, c, s,
                                  NUM_KV, HALF, BLOCK_KV, BLOCK_HALF)

    slot = tl.load(slot_ptr + tok).to(tl.int64)
    if slot >= 0:
        blk = slot // block_size
        off = slot % block_size
        heads = tl.arange(0, BLOCK_KV)[:, None]
        kc = kc_ptr + blk * skc_b + off * skc_o + heads * skc_h + cols
        vsrc = v_ptr + tok * sv_t + heads * sv_h + cols
        v1 = tl.load(vsrc, mask=kmask, other=0.0)
        v2 = tl.load(vsrc + HALF, mask=kmask, other=0.0)
        vc = vc_ptr + blk * svc_b + off * svc_o + heads * svc_h + cols
        if FP8:
            v1 = v1.to(tl.float32)
            v2 = v2.to(tl.float32)
            ks = token_scale(tl.maximum(tl.max(tl.abs(k1), 1), tl.max(tl.abs(k2), 1)))[:, None]  # [KV, 1]
            vs = token_scale(tl.maximum(tl.max(tl.abs(v1), 1), tl.max(tl.abs(v2), 1)))[:, None]
            tl.store(kc, to_e4m3(k1, ks), mask=kmask)
            tl.store(kc + HALF, to_e4m3(k2, ks), mask=kmask)
            tl.store(vc, to_e4m3(v1, vs), mask=kmask)
            tl.store(vc + HALF, to_e4m3(v2, vs), mask=kmask)
            s_off = blk * ss_b + off * ss_o + heads * ss_h
            head_ok = heads < NUM_KV
            tl.store(ks_ptr + s_off, ks.to(tl.bfloat16), mask=head_ok)
            tl.store(vs_ptr + s_off, vs.to(tl.bfloat16), mask=head_ok)
        else:
            tl.store(kc, k1.to(kc_ptr.dtype.element_ty), mask=kmask)
            tl.store(kc + HALF, k2.to(kc_ptr.dtype.element_ty), mask=kmask)
            tl.store(vc, v1.to(vc_ptr.dtype.element_ty), mask=kmask)
            tl.store(vc + HALF, v2.to(vc_ptr.dtype.element_ty), mask=kmask)


def rope_and_cache_triton(
    q: torch.Tensor,  # [T, H, D]
    k: torch.Tensor,  # [T, KVH, D]
    v: torch.Tensor,  # [T, KVH, D]
    cos: torch.Tensor,  # [T, D/2] fp32, or [max_positions, D/2] when positions is given
    sin: torch.Tensor,
    k_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [T] int64, -1: not stored
    positions: torch.Tensor | None = None,  # [T] int: rows of cos/sin to use (None: row t)
    inplace: bool = False,
    k_scales: torch.Tensor | None = None,  # [num_blocks, block_size, KVH] uint8: an FP8 cache's
    v_scales: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated (q, k); k (rotated) and v stored at their slots (quantised into an FP8 cache, with
    its scales). inplace: q and k are overwritten and returned (saves two allocations; the caller
    must not need the unrotated values).

    q/k/v may be strided views (e.g. splits of a fused qkv output) as long as the last dim is
    contiguous; the caches may be any strided view whose last dim is contiguous.
    """
    t, num_q, d = q.shape
    num_kv = k.shape[1]
    assert d % 2 == 0 and k.shape[2] == d and v.shape == k.shape
    assert q.stride(2) == 1 and k.stride(2) == 1 and v.stride(2) == 1
    assert k_cache.stride(3) == 1 and v_cache.stride(3) == 1
    assert cos.stride(1) == 1 and sin.stride() == cos.stride()
    q_out = q if inplace else torch.empty_like(q)
    k_out = k if inplace else torch.empty_like(k)
    if t == 0:
        return q_out, k_out
    half = d // 2
    pos = positions if positions is not None else slot_mapping  # unused when GATHER is False
    ks, vs, scale_strides = scale_args(k_scales, v_scales, slot_mapping)
    _rope_cache_kernel[(t,)](
        q, k, v, q_out, k_out, cos, sin, pos, slot_mapping, k_cache, v_cache, ks, vs,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), *scale_strides,
        k_cache.shape[1], cos.stride(0),
        NUM_Q=num_q, NUM_KV=num_kv, HALF=half,
        BLOCK_Q=triton.next_power_of_2(num_q), BLOCK_KV=triton.next_power_of_2(num_kv),
        BLOCK_HALF=triton.next_power_of_2(half), GATHER=positions is not None, FP8=k_scales is not None,
        num_warps=4 if num_q * d >= 2048 else 1,
    )
    return q_out, k_out
