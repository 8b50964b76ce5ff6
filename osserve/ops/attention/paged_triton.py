"""Triton paged attention with sinks and sliding window: the prefill / mixed-batch kernel, the
entry point, and a Triton `write_kv`. The decode kernel (split-KV) is in attention/decode_triton.py.

Same function as `attention.paged_attention_reference`; all metadata lives on the device and the
host passes only the ints it already knows (max_query_len, max_seq_len), so nothing here syncs.

Online softmax, in the exp2 domain (scores pre-multiplied by scale * log2(e)):
  state per query row: m (running max), l (running denominator), acc (unnormalised numerator).
  The sink is one extra logit s that adds exp2(s - m) to the denominator and nothing to the
  numerator. Seeding the state with it -- m = s, l = exp2(s - s) = 1, acc = 0 -- is exactly "the
  sink column has already been seen", and keeps m finite, so a row whose visible keys are all
  masked in a tile never computes exp2(-inf - -inf) = NaN.
  per KV tile: m' = max(m, rowmax(qk)); alpha = exp2(m - m'); p = exp2(qk - m')
               l = l * alpha + rowsum(p); acc = acc * alpha + p @ V; m = m'
  out = acc / l.
An FP8 cache (attention/kv_format.py: e4m3 codes, a bf16 scale per token and kv head) is read
as codes converted to q's dtype, each key's scale folded into its column of qk (with the softmax
scale) and each value's into its column of p before p @ V; the write quantises (write_kv_triton,
the RoPE kernels in ops/rope/).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from osserve.ops.attention.decode_triton import paged_decode_triton
from osserve.ops.attention.fp8_triton import scale_args, scale_value, to_e4m3, token_scale
from osserve.ops.attention.metadata import TreeMask
from osserve.ops.policy import interpreting

LOG2E = 1.4426950408889634


@triton.jit
def _tiles(
    acc, l_i, m_i,  # online-softmax state: [M, D], [M], [M] fp32
    q, q_pos,  # [M, D], [M] absolute query positions
    start, end,  # key positions [start, end) of this phase, stepped by BLOCK_N
    bt_row, k_base, v_base,  # this sequence's block-table row; K/V pointers at this kv head
    ks_base, vs_base,  # FP8: the scales' pointers at this kv head
    scale_log2e, window, stride_kb, stride_ks, stride_vb, stride_vs, stride_sb, stride_ss,
    q_real, tree_bits, tree_start,  # TREE: [M] real positions, [M] int64 ancestor bits, the tree's start
    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    HAS_WINDOW: tl.constexpr, MASK: tl.constexpr, TREE: tl.constexpr, FP8: tl.constexpr,
):
    """Fold keys [start, end) into the state. MASK=False: the caller guarantees every key is
    visible to every row and every tile is whole, so no bounds, causal, window or tree mask.
    TREE: the window counts from each row's real position, and keys inside the tree
    (metadata.TreeMask) are seen only where the row's bit is set. FP8: K and V are e4m3 codes; a
    key's scale joins its column of the scores, a value's its column of p (attention/kv_format.py)."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for tile in range(start, end, BLOCK_N):
        k_pos = tile + offs_n  # [N]
        # Per-key block-table lookup: any block size, any (shuffled) block order.
        if MASK:
            k_ok = k_pos < end
            blk = tl.load(bt_row + k_pos // BLOCK_SIZE, mask=k_ok, other=0)
            k_ok = k_ok & (blk >= 0)
        else:
            blk = tl.load(bt_row + k_pos // BLOCK_SIZE)
        blk = blk.to(tl.int64)
        in_blk = k_pos % BLOCK_SIZE
        k_ptrs = k_base + (blk * stride_kb + in_blk * stride_ks)[:, None] + offs_d[None, :]
        v_ptrs = v_base + (blk * stride_vb + in_blk * stride_vs)[:, None] + offs_d[None, :]
        if MASK:
            k = tl.load(k_ptrs, mask=k_ok[:, None], other=0.0)
        else:
            k = tl.load(k_ptrs)
        if FP8:
            s_offs = blk * stride_sb + in_blk * stride_ss
            if MASK:
                k_scale = scale_value(tl.load(ks_base + s_offs, mask=k_ok, other=0.0))
                v_scale = scale_value(tl.load(vs_base + s_offs, mask=k_ok, other=0.0))
            else:
                k_scale = scale_value(tl.load(ks_base + s_offs))
                v_scale = scale_value(tl.load(vs_base + s_offs))
            qk = tl.dot(q, tl.trans(k.to(q.dtype))) * (k_scale * scale_log2e)[None, :]  # [M, N] fp32
        else:
            qk = tl.dot(q, tl.trans(k)) * scale_log2e  # [M, N] fp32
        if MASK:
            dist = q_pos[:, None] - k_pos[None, :]
            visible = (dist >= 0) & k_ok[None, :]
            if HAS_WINDOW:
                if TREE:
                    visible = visible & (q_real[:, None] - k_pos[None, :] < window)
                else:
                    visible = visible & (dist < window)
            if TREE:
                rel = k_pos - tree_start
                inside = (rel >= 0) & (rel < 64)
                bit = (tree_bits[:, None] >> tl.minimum(tl.maximum(rel, 0), 63).to(tl.int64)[None, :]) & 1
                visible = visible & ((inside == 0)[None, :] | (bit != 0))
            qk = tl.where(visible, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if MASK:
            v = tl.load(v_ptrs, mask=k_ok[:, None], other=0.0)
        else:
            v = tl.load(v_ptrs)
        if FP8:
            acc = acc * alpha[:, None] + tl.dot((p * v_scale[None, :]).to(q.dtype), v.to(q.dtype))
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc, l_i, m_i


# Per-step sizes are not specialised (Triton would compile a variant for a table width of 1, of a
# multiple of 16, and of anything else, and a serving step that meets one first waits ~1 s for it),
# nor the alignment of the per-sequence tables a mixed batch's split slices from its first prompt on
# (seq_lens[lo:] is 16-byte aligned only where lo is a multiple of 4): served 20b steps compiled
# the block table's unaligned variant after the warm-up (H100, 2026-11-27, compile_log.py).
@triton.jit(do_not_specialize=["window", "stride_bt"],
            do_not_specialize_on_alignment=["qsl_ptr", "seq_lens_ptr", "bt_ptr"])
def _prefill_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, sinks_ptr,
    ks_ptr, vs_ptr,  # FP8: [num_blocks, block_size, kv_heads] bf16 scales (else unused)
    qsl_ptr,  # [B+1] int32 query_start_loc
    seq_lens_ptr,  # [B] int32
    bt_ptr,  # [B, max_blocks] int32, -1 holes
    tree_bits_ptr, tree_pos_ptr, tree_start_ptr,  # TREE: metadata.TreeMask's [T] int64, [T] int64, [B] int32
    scale_log2e, window,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
    stride_sb, stride_ss, stride_sh,  # the scales' (K's and V's alike)
    GROUP: tl.constexpr,  # q heads per kv head
    GROUP_P: tl.constexpr,  # GROUP rounded up to a power of two
    BLOCK_Q: tl.constexpr,  # query tokens per tile; the tile's M = BLOCK_Q * GROUP_P rows
    BLOCK_N: tl.constexpr,  # keys per KV tile
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,  # cache block size (power of two)
    HAS_WINDOW: tl.constexpr,
    TREE: tl.constexpr,  # draft trees among the sequences (metadata.TreeMask)
    FP8: tl.constexpr,  # an FP8 cache (attention/kv_format.py)
    SKIP_SINGLE: tl.constexpr,  # one-token queries are the decode kernel's (a mixed batch split)
):
    """One program: BLOCK_Q query tokens of sequence b x the GROUP q heads of kv head kvh.

    Rows of the tile are (token, head-in-group) pairs, token-major, so every K/V tile is loaded
    once and shared by the whole GQA group (one tl.dot of [M, D] x [D, N]).
    """
    b = tl.program_id(0)
    qt = tl.program_id(1)
    kvh = tl.program_id(2)
    q_start = tl.load(qsl_ptr + b)
    q_len = tl.load(qsl_ptr + b + 1) - q_start
    if qt * BLOCK_Q >= q_len:  # grid is sized by max_query_len; shorter sequences stop here
        return
    if SKIP_SINGLE and q_len == 1:
        return
    seq_len = tl.load(seq_lens_ptr + b)
    first_q_pos = seq_len - q_len  # this chunk is the last q_len positions of the sequence

    BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_P
    offs_m = tl.arange(0, BLOCK_M)
    tok = qt * BLOCK_Q + offs_m // GROUP_P  # [M] token index within the chunk
    g = offs_m % GROUP_P
    head = kvh * GROUP + g
    row_ok = (tok < q_len) & (g < GROUP)
    offs_d = tl.arange(0, HEAD_DIM)
    q_rows = (q_start + tok).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None], other=0.0)  # [M, D]
    q_pos = first_q_pos + tok  # [M] absolute positions

    # Sink-seeded state (see the module docstring).
    m_i = tl.load(sinks_ptr + head, mask=g < GROUP, other=0.0).to(tl.float32) * 1.4426950408889634
    l_i = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    # Keys this tile can see: up to its last query (causal); on a window layer, from the first
    # query's window start. The loops start exactly there: no tile wholly outside the window is
    # ever loaded, and positions below `lo` (where freed -1 blocks live) are never indexed.
    hi = first_q_pos + tl.minimum(q_len, qt * BLOCK_Q + BLOCK_Q)
    q_first = first_q_pos + qt * BLOCK_Q
    if TREE:
        # A tree's rows stand in depth order, so the tile's first row has its lowest real position;
        # real positions are at most the cache positions, so `hi` still bounds the tile's keys.
        q_real = tl.load(tree_pos_ptr + q_rows, mask=row_ok, other=0)
        tree_bits = tl.load(tree_bits_ptr + q_rows, mask=row_ok, other=-1)
        tree_start = tl.load(tree_start_ptr + b)
        q_first_real = tl.load(tree_pos_ptr + q_start + qt * BLOCK_Q)
    else:
        q_real = q_pos
        tree_bits = q_pos
        tree_start = 0
        q_first_real = q_first
    # [full_lo, full_hi): keys every row of the tile sees (<= the first query, and inside the
    # last query's window). Whole BLOCK_N tiles there skip the causal/window mask; only the few
    # boundary tiles before and after (at most ~BLOCK_Q keys each side) pay for it.
    if HAS_WINDOW:
        lo = tl.maximum(q_first_real - window + 1, 0)
        full_lo = tl.minimum(tl.maximum(hi - window, lo), hi)
    else:
        lo = 0
        full_lo = 0
    if TREE:  # below the tree's start every key is committed: seen by every row
        full_hi = tl.maximum(tl.minimum(q_first + 1, tree_start), full_lo)
    else:
        full_hi = tl.maximum(q_first + 1, full_lo)
    full_end = full_lo + ((full_hi - full_lo) // BLOCK_N) * BLOCK_N
    bt_row = bt_ptr + b * stride_bt
    k_base = k_ptr + kvh * stride_kh
    v_base = v_ptr + kvh * stride_vh
    ks_base = ks_ptr + kvh * stride_sh
    vs_base = vs_ptr + kvh * stride_sh
    acc, l_i, m_i = _tiles(acc, l_i, m_i, q, q_pos, lo, full_lo, bt_row, k_base, v_base, ks_base, vs_base,
                           scale_log2e, window, stride_kb, stride_ks, stride_vb, stride_vs, stride_sb, stride_ss,
                           q_real, tree_bits, tree_start, BLOCK_N, HEAD_DIM, BLOCK_SIZE, HAS_WINDOW, True, TREE,
                           FP8)
    acc, l_i, m_i = _tiles(acc, l_i, m_i, q, q_pos, full_lo, full_end, bt_row, k_base, v_base, ks_base, vs_base,
                           scale_log2e, window, stride_kb, stride_ks, stride_vb, stride_vs, stride_sb, stride_ss,
                           q_real, tree_bits, tree_start, BLOCK_N, HEAD_DIM, BLOCK_SIZE, HAS_WINDOW, False, TREE,
                           FP8)
    acc, l_i, m_i = _tiles(acc, l_i, m_i, q, q_pos, full_end, hi, bt_row, k_base, v_base, ks_base, vs_base,
                           scale_log2e, window, stride_kb, stride_ks, stride_vb, stride_vs, stride_sb, stride_ss,
                           q_real, tree_bits, tree_start, BLOCK_N, HEAD_DIM, BLOCK_SIZE, HAS_WINDOW, True, TREE,
                           FP8)

    out = acc / l_i[:, None]
    tl.store(o_ptr + q_rows[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


def _prefill(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, sinks: torch.Tensor,
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
    scale: float, window: int | None, max_query_len: int, out: torch.Tensor,
    block_m: int | None = None, block_n: int | None = None, num_stages: int | None = None,
    tree: TreeMask | None = None, k_scales: torch.Tensor | None = None, v_scales: torch.Tensor | None = None,
    skip_single: bool = False,
) -> None:
    num_seqs = seq_lens.shape[0]
    num_heads, head_dim = q.shape[1], q.shape[2]
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // kv_heads
    group_p = triton.next_power_of_2(group)
    # M = 128 rows on the GPU (16 tokens x 8 heads for gpt-oss); at least 16 for tl.dot.
    block_m = block_m or (16 if interpreting() else 128)
    block_q = max(1, max(block_m, 16) // group_p)
    # BLOCK_N 32 measured fastest on the H100 with 128-row tiles (benchmarks/NOTES-attention.md).
    block_n = block_n or (16 if interpreting() else 32)
    grid = (num_seqs, triton.cdiv(max_query_len, block_q), kv_heads)
    # Without a tree, or scales, the kernel reads none of those arguments: `sinks` stands in, a
    # parameter whose alignment never changes. seq_lens, sliced by a mixed batch's split, did stand
    # in, and a 120b server's first wave compiled the kernel for its unaligned tree arguments (H200,
    # 2026-11-27, compile_log.py).
    tree_args = (tree.bits, tree.positions, tree.start) if tree is not None else (sinks, sinks, sinks)
    ks, vs, scale_strides = scale_args(k_scales, v_scales, sinks)
    _prefill_kernel[grid](
        q, k_cache, v_cache, out, sinks, ks, vs, query_start_loc, seq_lens, block_tables, *tree_args,
        scale * LOG2E, window or 0,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0), *scale_strides,
        GROUP=group, GROUP_P=group_p, BLOCK_Q=block_q, BLOCK_N=block_n, HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, HAS_WINDOW=window is not None, TREE=tree is not None, FP8=k_scales is not None,
        SKIP_SINGLE=skip_single, num_warps=4 if block_q * group_p <= 64 else 8, num_stages=num_stages or 2,
    )


def paged_attention_triton(
    q: torch.Tensor,  # [T, H, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, kv_heads, D]
    v_cache: torch.Tensor,
    sinks: torch.Tensor,  # [H]
    query_start_loc: torch.Tensor,  # [B+1] int32, device
    seq_lens: torch.Tensor,  # [B] int32, device
    block_tables: torch.Tensor,  # [B, max_blocks] int32, device, -1 holes
    scale: float,
    window: int | None,
    max_query_len: int,
    max_seq_len: int,
    is_decode: bool,
    out: torch.Tensor | None = None,
    *,
    num_splits: int | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    num_stages: int | None = None,
    num_warps: int | None = None,
    tree: TreeMask | None = None,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
    prompt_range: tuple[int, int] | None = None,
    decode_gluon: bool | None = None,
) -> torch.Tensor:
    """Paged attention on the device; returns out [T, H, D] (q's dtype). `tree`: draft trees
    among the sequences (metadata.TreeMask; the prefill kernel, whatever the query lengths).
    k_scales / v_scales: an FP8 cache's scales (attention/kv_format.py).

    prompt_range (lo, hi): a mixed batch, split in two launches. Its one-token queries (decodes,
    anywhere in the batch) go to the split-KV decode kernel, which skips the longer ones, and the
    prefill kernel runs over sequences [lo, hi) only, which hold every longer query, skipping the
    one-token queries among them. In one prefill launch a decode would take a 128-row tile for its
    8 rows and the grid would run max_query_len / 16 programs a sequence for it, nearly all
    returning at once. Graph-safe with (0, num_seqs): every choice is then made on the device.

    is_decode: every sequence has exactly one query (the decode kernel, split-KV). The decode path
    does no host sync and allocates only buffers whose sizes depend on (B, H, D, num_splits), so it
    can be captured in a CUDA graph; max_seq_len only picks the number of splits (performance),
    never correctness, so a graph captured at one max_seq_len replays correctly at any length.
    num_splits / block_m / block_n / num_stages / num_warps (decode) override the heuristics (tests,
    benchmarks); decode_gluon: decode_triton.paged_decode_triton's `gluon`.
    """
    assert q.shape[2] == k_cache.shape[3] and q.shape[2] & (q.shape[2] - 1) == 0, "pow2 head_dim"
    assert q.shape[1] % k_cache.shape[2] == 0
    assert k_cache.stride(3) == 1 and v_cache.stride(3) == 1 and q.stride(2) == 1
    if out is None:
        out = torch.empty_like(q)
    if q.shape[0] == 0:
        return out
    if is_decode and tree is None:
        paged_decode_triton(q, k_cache, v_cache, sinks, query_start_loc, seq_lens, block_tables,
                            scale, window, max_seq_len, out, num_splits=num_splits, block_n=block_n,
                            k_scales=k_scales, v_scales=v_scales, num_warps=num_warps, num_stages=num_stages,
                            gluon=decode_gluon)
    else:
        split = prompt_range if tree is None else None
        if split is not None:
            paged_decode_triton(q, k_cache, v_cache, sinks, query_start_loc, seq_lens, block_tables,
                                scale, window, max_seq_len, out, num_splits=num_splits,
                                k_scales=k_scales, v_scales=v_scales, gluon=decode_gluon)
        lo, hi = split or (0, seq_lens.shape[0])
        _prefill(q, k_cache, v_cache, sinks, query_start_loc[lo:hi + 1], seq_lens[lo:hi], block_tables[lo:hi],
                 scale, window, max_query_len, out, block_m=block_m, block_n=block_n, num_stages=num_stages,
                 tree=tree, k_scales=k_scales, v_scales=v_scales, skip_single=split is not None)
    return out


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, slot_ptr,
    stride_kt, stride_vt, stride_kc_slot, stride_vc_slot,
    NUM_KV: tl.constexpr, BLOCK_KV: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    FP8: tl.constexpr,  # an FP8 cache: codes and a scale per head (attention/kv_format.py)
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:  # padding token: not stored
        return
    heads = tl.arange(0, BLOCK_KV)
    cols = tl.arange(0, BLOCK_D)
    offs = heads[:, None] * HEAD_DIM + cols[None, :]  # [KV, D]: one token's row
    mask = (heads[:, None] < NUM_KV) & (cols[None, :] < HEAD_DIM)
    k = tl.load(k_ptr + t.to(tl.int64) * stride_kt + offs, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + t.to(tl.int64) * stride_vt + offs, mask=mask, other=0.0).to(tl.float32)
    if FP8:
        ks = token_scale(tl.max(tl.abs(k), 1))
        vs = token_scale(tl.max(tl.abs(v), 1))
        tl.store(kc_ptr + slot * stride_kc_slot + offs, to_e4m3(k, ks[:, None]), mask=mask)
        tl.store(vc_ptr + slot * stride_vc_slot + offs, to_e4m3(v, vs[:, None]), mask=mask)
        tl.store(ks_ptr + slot * NUM_KV + heads, ks.to(tl.bfloat16), mask=heads < NUM_KV)
        tl.store(vs_ptr + slot * NUM_KV + heads, vs.to(tl.bfloat16), mask=heads < NUM_KV)
    else:
        tl.store(kc_ptr + slot * stride_kc_slot + offs, k.to(kc_ptr.dtype.element_ty), mask=mask)
        tl.store(vc_ptr + slot * stride_vc_slot + offs, v.to(vc_ptr.dtype.element_ty), mask=mask)


def write_kv_triton(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    slot_mapping: torch.Tensor, k_scales: torch.Tensor | None = None, v_scales: torch.Tensor | None = None,
) -> None:
    """Store k, v [T, kv_heads, head_dim] at cache rows slot_mapping [T] (-1: skip); with scales
    [num_blocks, block_size, kv_heads] (an FP8 cache), quantised as kv_format.py says."""
    num_tokens = k.shape[0]
    if num_tokens == 0:
        return
    # Each token's [kv_heads, head_dim] is one contiguous row, in k/v and in the cache.
    assert k.stride(2) == 1 and k.stride(1) == k.shape[2] and v.stride(2) == 1
    assert v.stride(1) == v.shape[2] and k_cache.is_contiguous() and v_cache.is_contiguous()
    fp8 = k_scales is not None and v_scales is not None
    assert not fp8 or (k_scales.is_contiguous() and v_scales.is_contiguous())  # type: ignore[union-attr]
    row = k.shape[1] * k.shape[2]
    _write_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, k_scales if fp8 else slot_mapping, v_scales if fp8 else slot_mapping,
        slot_mapping, k.stride(0), v.stride(0), row, row,
        NUM_KV=k.shape[1], BLOCK_KV=triton.next_power_of_2(k.shape[1]), HEAD_DIM=k.shape[2],
        BLOCK_D=triton.next_power_of_2(k.shape[2]), FP8=fp8,
        num_warps=4,
    )


__all__ = ["paged_attention_triton", "write_kv_triton"]
