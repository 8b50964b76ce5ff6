"""Triton paged decode attention (one query token per sequence) with split-KV (flash-decoding).

One program = (sequence b, kv head, split s). Its M dimension is the GQA group: the 8 q heads of
one kv head (padded to 16 rows for tl.dot), so each K/V tile is read once per kv head.

Split-KV: a sequence's visible keys [lo, hi) are cut into NUM_SPLITS equal partitions (rounded up
to whole KV tiles) computed in parallel; the partition size is derived on the device from that
sequence's own length, so the grid (B, kv_heads, NUM_SPLITS) is fixed and a CUDA graph replays
correctly for any lengths. Each split keeps a plain (unseeded) online-softmax state in the exp2
domain: m_s (max, -1e30 when it saw nothing), l_s = sum exp2(x - m_s), acc_s = sum exp2(x - m_s) v.
The reduce kernel merges them and adds the sink exactly once:
  M = max(sink, max_s m_s);  L = exp2(sink - M) + sum_s l_s exp2(m_s - M)
  out = sum_s acc_s exp2(m_s - M) / L
Empty splits (m_s = -1e30, l_s = 0, acc_s = 0) get weight exp2(-1e30 - M) = 0.
With NUM_SPLITS == 1 the kernel seeds its state with the sink (m = sink, l = 1) and writes the
output itself; no reduce launch. An FP8 cache is read as paged_triton.py says; on sm_90 by
fp8_decode_gluon.py's kernel instead, which writes the same partials for the same merge.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from osserve.ops.attention import fp8_decode_gluon
from osserve.ops.attention.fp8_triton import fp8_scores, fp8_values, query_f16, scale_args, scale_value
from osserve.ops.pdl import pdl_enter, pdl_launch, prefetch_before_wait, prefetch_l2
from osserve.ops.policy import interpreting

LOG2E = 1.4426950408889634
MIN_PARTITION = 256  # tokens per split at least: below this the merge costs more than it saves
MAX_SPLITS = 64


@triton.jit(do_not_specialize=["window", "stride_bt"])  # per-step sizes: no recompiles (attention/paged_triton.py)
def _decode_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, sinks_ptr, qsl_ptr, seq_lens_ptr, bt_ptr,
    ks_ptr, vs_ptr,  # FP8: [num_blocks, block_size, kv_heads] bf16 scales (else unused)
    part_acc_ptr,  # [B, H, NUM_SPLITS, D] fp32 (only with NUM_SPLITS > 1)
    part_m_ptr, part_l_ptr,  # [B, H, NUM_SPLITS] fp32
    scale_log2e, window,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
    stride_sb, stride_ss, stride_sh,
    NUM_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_P: tl.constexpr,  # GROUP padded to a power of two >= 16 (tl.dot's minimum M)
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    PDL: tl.constexpr,
    PREFETCH: tl.constexpr,
    FP8: tl.constexpr,  # an FP8 cache (attention/kv_format.py): scales fold into the scores' and p's columns
    ASM: tl.constexpr,  # compiled (not the interpreter): FP8 codes converted by inline PTX (fp8_triton.py)
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    s = tl.program_id(2)
    # The step's inputs (copied in before the step's kernels) may be read before the wait: ops/pdl.py.
    q_row = tl.load(qsl_ptr + b)
    # No query for this sequence, or (in a mixed batch) a prompt chunk the prefill kernel answers:
    # nothing to write.
    if tl.load(qsl_ptr + b + 1) != q_row + 1:
        return
    seq_len = tl.load(seq_lens_ptr + b)
    # The query sits at position seq_len - 1; it sees [lo, seq_len).
    hi = seq_len
    if HAS_WINDOW:
        lo = tl.maximum(seq_len - window, 0)
    else:
        lo = 0
    if NUM_SPLITS > 1:
        part = tl.cdiv(tl.cdiv(hi - lo, NUM_SPLITS), BLOCK_N) * BLOCK_N
        start = lo + s * part
        end = tl.minimum(start + part, hi)
    else:
        start = lo
        end = hi
    if PREFETCH:  # the first tile's keys and values into L2 while the kernel before ends (a hint only)
        pf_pos = start + tl.arange(0, BLOCK_N)
        pf_blk = tl.load(bt_ptr + b * stride_bt + pf_pos // BLOCK_SIZE, mask=pf_pos < end, other=-1).to(tl.int64)
        pf_ok = (pf_pos < end) & (pf_blk >= 0)
        pf_k = pf_blk * stride_kb + (pf_pos % BLOCK_SIZE) * stride_ks + kvh * stride_kh
        pf_v = pf_blk * stride_vb + (pf_pos % BLOCK_SIZE) * stride_vs + kvh * stride_vh
        prefetch_l2(tl.where(pf_ok, k_ptr + pf_k, k_ptr))
        prefetch_l2(tl.where(pf_ok, v_ptr + pf_v, v_ptr))
    pdl_enter(PDL)

    g = tl.arange(0, GROUP_P)
    g_ok = g < GROUP
    head = kvh * GROUP + g
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_ptr + q_row.to(tl.int64) * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=g_ok[:, None], other=0.0)  # [GROUP_P, D]
    if FP8:
        q = query_f16(q)
    if NUM_SPLITS > 1:
        m_i = tl.full([GROUP_P], -1e30, dtype=tl.float32)  # finite: exp2(-inf - m_i) stays 0
        l_i = tl.zeros([GROUP_P], dtype=tl.float32)
    else:  # sink-seeded, as in the prefill kernel
        m_i = tl.load(sinks_ptr + head, mask=g_ok, other=0.0).to(tl.float32) * 1.4426950408889634
        l_i = tl.full([GROUP_P], 1.0, dtype=tl.float32)
    acc = tl.zeros([GROUP_P, HEAD_DIM], dtype=tl.float32)

    offs_n = tl.arange(0, BLOCK_N)
    # Only [start, end) is ever indexed: tiles outside the window and freed (-1) blocks, which
    # lie below lo, are never loaded. All keys are <= the query's position: no causal mask.
    for tile in range(start, end, BLOCK_N):
        k_pos = tile + offs_n
        k_ok = k_pos < end
        blk = tl.load(bt_ptr + b * stride_bt + k_pos // BLOCK_SIZE, mask=k_ok, other=0)
        k_ok = k_ok & (blk >= 0)
        blk = blk.to(tl.int64)
        in_blk = k_pos % BLOCK_SIZE
        k_rows = blk * stride_kb + in_blk * stride_ks + kvh * stride_kh
        k = tl.load(k_ptr + k_rows[:, None] + offs_d[None, :], mask=k_ok[:, None], other=0.0)
        if FP8:
            s_rows = blk * stride_sb + in_blk * stride_ss + kvh * stride_sh
            k_scale = scale_value(tl.load(ks_ptr + s_rows, mask=k_ok, other=0.0))
            qk = fp8_scores(q, k, k_scale, scale_log2e, ASM)  # [GROUP_P, N]
        else:
            qk = tl.dot(q, tl.trans(k)) * scale_log2e  # [GROUP_P, N]
        qk = tl.where(k_ok[None, :], qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v_rows = blk * stride_vb + in_blk * stride_vs + kvh * stride_vh
        v = tl.load(v_ptr + v_rows[:, None] + offs_d[None, :], mask=k_ok[:, None], other=0.0)
        if FP8:
            v_scale = scale_value(tl.load(vs_ptr + s_rows, mask=k_ok, other=0.0))
            acc = acc * alpha[:, None] + fp8_values(p, v, v_scale, ASM)
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    if NUM_SPLITS > 1:
        part_row = (b * NUM_HEADS + head) * NUM_SPLITS + s  # [GROUP_P]
        tl.store(part_acc_ptr + part_row[:, None] * HEAD_DIM + offs_d[None, :], acc,
                 mask=g_ok[:, None])
        tl.store(part_m_ptr + part_row, m_i, mask=g_ok)
        tl.store(part_l_ptr + part_row, l_i, mask=g_ok)
    else:
        out = acc / l_i[:, None]
        tl.store(o_ptr + q_row.to(tl.int64) * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=g_ok[:, None])


@triton.jit
def _merge_kernel(
    o_ptr, sinks_ptr, qsl_ptr, part_acc_ptr, part_m_ptr, part_l_ptr,
    stride_ot, stride_oh,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr, PDL: tl.constexpr,
):
    """One program per (sequence, q head): log-sum-exp merge of the splits plus the sink."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    q_row = tl.load(qsl_ptr + b)
    if tl.load(qsl_ptr + b + 1) != q_row + 1:  # as in _decode_kernel
        return
    sink = tl.load(sinks_ptr + h).to(tl.float32) * 1.4426950408889634
    pdl_enter(PDL)
    offs_s = tl.arange(0, NUM_SPLITS)
    offs_d = tl.arange(0, HEAD_DIM)
    base = (b * NUM_HEADS + h) * NUM_SPLITS
    m = tl.load(part_m_ptr + base + offs_s)  # [S]
    l_s = tl.load(part_l_ptr + base + offs_s)
    acc = tl.load(part_acc_ptr + (base + offs_s)[:, None] * HEAD_DIM + offs_d[None, :])  # [S, D]
    m_all = tl.maximum(tl.max(m, 0), sink)
    w = tl.exp2(m - m_all)  # [S]
    denom = tl.exp2(sink - m_all) + tl.sum(l_s * w, 0)
    out = tl.sum(acc * w[:, None], 0) / denom  # [D]
    tl.store(o_ptr + q_row.to(tl.int64) * stride_ot + h * stride_oh + offs_d,
             out.to(o_ptr.dtype.element_ty))


@functools.lru_cache(maxsize=8)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def choose_num_splits(num_seqs: int, kv_heads: int, max_context: int, device: torch.device) -> int:
    """Splits so that B * kv_heads * splits fills ~2 waves of SMs (splits_within_bounds)."""
    if device.type != "cuda":
        return 1
    return splits_within_bounds(triton.cdiv(2 * _num_sms(_index(device)), max(1, num_seqs * kv_heads)), max_context)


def gluon_num_splits(num_seqs: int, kv_heads: int, max_context: int, num_sms: int) -> int:
    """fp8_decode_gluon.py's splits: its one-warp programs fill about one wave (WAVE_PROGRAMS an SM;
    rounded down: at 1,024 programs on an H100 a second split measured slower, 498 against 476 us)."""
    return splits_within_bounds(fp8_decode_gluon.WAVE_PROGRAMS * num_sms // max(1, num_seqs * kv_heads), max_context)


def splits_within_bounds(by_occupancy: int, max_context: int) -> int:
    """At most by_occupancy splits, each of >= MIN_PARTITION tokens, at most MAX_SPLITS; a power of two
    (the merge's tl.arange, and few distinct compiled variants)."""
    by_length = max(1, max_context // MIN_PARTITION)
    splits = max(1, min(by_occupancy, by_length, MAX_SPLITS))
    return 1 << (splits.bit_length() - 1)  # round down to a power of two


def paged_decode_triton(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, sinks: torch.Tensor,
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
    scale: float, window: int | None, max_seq_len: int, out: torch.Tensor,
    num_splits: int | None = None, block_n: int | None = None,
    k_scales: torch.Tensor | None = None, v_scales: torch.Tensor | None = None,
    num_warps: int | None = None, num_stages: int | None = None, gluon: bool | None = None,
) -> None:
    """Decode: q [T, H, D] with one row per sequence that has a query (rows via query_start_loc).
    Sequences with longer queries (a mixed batch's prompt chunks) are left for the prefill kernel.
    k_scales / v_scales: an FP8 cache's scales (attention/kv_format.py). num_warps / num_stages /
    block_n: the Triton launch's (benchmarks sweep them). gluon: an FP8 cache read by
    fp8_decode_gluon.py's kernel; by default where the kernel policy is Hopper's and no Triton launch
    choice is given (benchmarks pass False for the Triton kernel)."""
    num_seqs = seq_lens.shape[0]
    num_heads, head_dim = q.shape[1], q.shape[2]
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // kv_heads
    max_context = max_seq_len if window is None else min(max_seq_len, window)
    fp8 = k_scales is not None
    if gluon is None:
        gluon = fp8 and block_n is None and num_warps is None and num_stages is None and not interpreting() \
            and fp8_decode_gluon.supported(q.device, head_dim, block_size, group)
    if num_splits is None and gluon:
        num_splits = gluon_num_splits(num_seqs, kv_heads, max_context, _num_sms(_index(q.device)))
    elif num_splits is None:
        num_splits = choose_num_splits(num_seqs, kv_heads, max_context, q.device)
    assert num_splits & (num_splits - 1) == 0, "num_splits must be a power of two"
    pdl = pdl_launch(q.device)
    # 128-key tiles: fewest loop trips; measured no slower than 32/64 on the H100 (NOTES).
    block_n = block_n or (16 if interpreting() else 128)
    if num_splits > 1:
        part_acc = torch.empty(num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32,
                               device=q.device)
        part_m = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=q.device)
        part_l = torch.empty_like(part_m)
    else:  # unused by the kernel; any fp32 pointer will do
        part_acc = part_m = part_l = out
    if gluon:
        assert k_scales is not None and v_scales is not None
        fp8_decode_gluon.launch_fp8_decode(q, k_cache, v_cache, k_scales, v_scales, sinks, query_start_loc, seq_lens,
                                           block_tables, scale, window, out, num_splits, part_acc, part_m, part_l, pdl)
    else:
        _launch_triton(q, k_cache, v_cache, sinks, query_start_loc, seq_lens, block_tables, k_scales, v_scales,
                       part_acc, part_m, part_l, scale, window, out, num_splits, block_n, block_size, group, pdl,
                       num_warps, num_stages)
    if num_splits > 1:
        _merge_kernel[(num_seqs, num_heads)](
            out, sinks, query_start_loc, part_acc, part_m, part_l, out.stride(0), out.stride(1),
            NUM_HEADS=num_heads, HEAD_DIM=head_dim, NUM_SPLITS=num_splits, PDL=pdl, num_warps=1,
            launch_pdl=pdl,
        )


def _launch_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, sinks: torch.Tensor,
                   query_start_loc: torch.Tensor, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                   k_scales: torch.Tensor | None, v_scales: torch.Tensor | None, part_acc: torch.Tensor,
                   part_m: torch.Tensor, part_l: torch.Tensor, scale: float, window: int | None, out: torch.Tensor,
                   num_splits: int, block_n: int, block_size: int, group: int, pdl: bool,
                   num_warps: int | None, num_stages: int | None) -> None:
    """The Triton kernel's launch (any cache)."""
    num_seqs, num_heads, head_dim, kv_heads = seq_lens.shape[0], q.shape[1], q.shape[2], k_cache.shape[2]
    ks, vs, scale_strides = scale_args(k_scales, v_scales, seq_lens)
    # An FP8 cache's tiles are half the bytes: a third stage in flight kept its loads ahead (H100,
    # batch 256, 1k / 2k contexts: 163 / 303 us against 216 / 420 with two; bf16 198 / 389; four
    # stages 214 / 396; benchmarks/diag/decode_attention_sweep.py --fp8). bf16 gains nothing from it.
    fp8 = k_scales is not None
    _decode_kernel[(num_seqs, kv_heads, num_splits)](
        q, k_cache, v_cache, out, sinks, query_start_loc, seq_lens, block_tables, ks, vs,
        part_acc, part_m, part_l, scale * LOG2E, window or 0,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0), *scale_strides,
        NUM_HEADS=num_heads, GROUP=group, GROUP_P=max(16, triton.next_power_of_2(group)),
        BLOCK_N=block_n, HEAD_DIM=head_dim, BLOCK_SIZE=block_size, HAS_WINDOW=window is not None,
        NUM_SPLITS=num_splits, PDL=pdl, PREFETCH=prefetch_before_wait(q.device), FP8=fp8,
        ASM=not interpreting(), num_warps=num_warps or 4, num_stages=num_stages or (3 if fp8 else 2),
        launch_pdl=pdl,
    )
