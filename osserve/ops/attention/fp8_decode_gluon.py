"""Decode attention over an FP8 KV cache (attention/kv_format.py) on Hopper, in Gluon: the codes go
from global memory straight into the registers of the MMA's operands, with no shared memory.

Why not the Triton kernel (decode_triton.py): its tiles of codes pass through shared memory twice (the
pipeliner's copy, then the trip into the dot's operand layout after conversion), and its loop is one
chain of waits per 128 keys for four warps. It read its half-size cache at 1.6-1.8 TB/s where the
bf16 kernel reads 2.7-2.8 (H100, batch 256, 1k / 2k contexts: 163 / 304 us against 198 / 389).

Here one warp is one program (sequence, kv head, split), with the GQA group's 8 query heads as the
rows of a 16-row `mma.sync` (m16n8k16, float16 operands, float32 sums), 32 keys (two 16-slot cache
blocks) a loop trip, and the next trip's codes and scales loaded while this one computes.
- Keys: q . k sums over the head dimension, so any order of it serves if q and k share it. Thread
  (g, c) of the warp (lane 4g + c) loads the 16 contiguous bytes 16c..16c+15 of each of its keys
  (one 16-byte load); read as the logical dimension 16kb + 8h + 2c + e for byte 16c + 4kb + 2h + e,
  they are exactly its B-operand registers (`K_WORDS`), and the query is loaded in that order too.
- Values: p @ V sums over the keys, and a B register holds two keys' codes at one dimension, which
  lie 512 bytes apart. Thread (g, c) loads 8 contiguous bytes 8g..8g+7 of each of its 8 keys; one
  `prmt` a pair of keys interleaves their bytes, and `cvt.rn.f16x2.e4m3x2` turns each pair into a
  B register (`V_PTX`). Output column 8j + g is then dimension 8g + j, undone at the store.
- Scales and float16 products as in attention/fp8_triton.py; the rescaling is lazy (`_trip`).
Compiled, the kernel uses no shared memory (tests/ops/test_fp8_decode_gluon.py checks its sm_90 build).
Splits, sinks and the merge are decode_triton.py's (the same partials).
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mma_v2

from osserve.ops.pdl import pdl_enter_gluon
from osserve.ops.policy import kernel_policy

TILE = gl.constexpr(32)  # keys a loop trip
BLOCK_SIZE = gl.constexpr(16)  # slots a cache block (the engine's): a trip is two whole blocks
HEAD_DIM = gl.constexpr(64)
LOG2E = gl.constexpr(1.4426950408889634)
RESCALE_LOG2 = gl.constexpr(8.0)  # _trip's
# One-warp programs an SM holds at once (65,536 registers / (32 x 196)): decode_triton.gluon_num_splits aims
# at one wave of them.
WAVE_PROGRAMS = 10

_MMA = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[1, 1], instr_shape=[16, 8])
MMA = gl.constexpr(_MMA)
A_OP = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=_MMA, k_width=2))
B_OP = gl.constexpr(gl.DotOperandLayout(operand_index=1, parent=_MMA, k_width=2))
# [32 keys, 16 words]: thread (g, c) holds keys g + 8n (n < 4), words 4c..4c+3 (registers first).
K_WORDS = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 1], [0, 2], [8, 0], [16, 0]],
    lane_bases=[[0, 4], [0, 8], [1, 0], [2, 0], [4, 0]],
    warp_bases=[], block_bases=[], shape=[32, 16]))
# [32 keys, 16 words]: thread (g, c) holds words 2g, 2g+1 of keys 2c + e + 8h + 16kb.
V_WORDS = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 1], [1, 0], [8, 0], [16, 0]],
    lane_bases=[[2, 0], [4, 0], [0, 2], [0, 4], [0, 8]],
    warp_bases=[], block_bases=[], shape=[32, 16]))

# Two words of codes ($4, $5) -> four registers of two float16: $0, $1 the low and high halves of $4,
# $2, $3 those of $5.
K_PTX = gl.constexpr("{ .reg .b16 a0, a1, a2, a3; mov.b32 {a0, a1}, $4; mov.b32 {a2, a3}, $5; "
                     "cvt.rn.f16x2.e4m3x2 $0, a0; cvt.rn.f16x2.e4m3x2 $1, a1; "
                     "cvt.rn.f16x2.e4m3x2 $2, a2; cvt.rn.f16x2.e4m3x2 $3, a3; }")
# Two words of an even key ($8, $9: bytes j = 0..3, 4..7) and the same two of the odd key after it
# ($10, $11) -> eight registers $0..$7: register j holds float16 of (even byte j, odd byte j).
V_PTX = gl.constexpr(
    "{ .reg .b32 t0, t1, t2, t3; .reg .b16 a0, a1, a2, a3, a4, a5, a6, a7; "
    "prmt.b32 t0, $8, $10, 0x5140; prmt.b32 t1, $8, $10, 0x7362; "
    "prmt.b32 t2, $9, $11, 0x5140; prmt.b32 t3, $9, $11, 0x7362; "
    "mov.b32 {a0, a1}, t0; mov.b32 {a2, a3}, t1; mov.b32 {a4, a5}, t2; mov.b32 {a6, a7}, t3; "
    "cvt.rn.f16x2.e4m3x2 $0, a0; cvt.rn.f16x2.e4m3x2 $1, a1; cvt.rn.f16x2.e4m3x2 $2, a2; "
    "cvt.rn.f16x2.e4m3x2 $3, a3; cvt.rn.f16x2.e4m3x2 $4, a4; cvt.rn.f16x2.e4m3x2 $5, a5; "
    "cvt.rn.f16x2.e4m3x2 $6, a6; cvt.rn.f16x2.e4m3x2 $7, a7; }")


@gluon.jit
def _keys_operand(words):
    """[32 keys, 16 words] codes (K_WORDS) -> the B operand [64 logical dims, 32 keys] float16."""
    o = gl.inline_asm_elementwise(K_PTX, "=r,=r,=r,=r,r,r", [words], dtype=(gl.float16,) * 4, is_pure=True,
                                  pack=2)
    # Output i at [key, 4c + 2m + e] (the pair packed in one register): byte 16c + 8m + 4 i1 + 2 i0 + e
    # (i = 2 i1 + i0), which holds dimension 16 (2m + i1) + 8 i0 + 2c + e.
    t = gl.join(gl.join(o[0], o[1]), gl.join(o[2], o[3]))
    t = gl.reshape(t, [TILE, 4, 2, 2, 2, 2])  # [key, c, m, e, i0, i1]
    t = gl.reshape(gl.permute(t, [0, 2, 5, 4, 1, 3]), [TILE, HEAD_DIM])  # [key, dim]
    return gl.convert_layout(gl.permute(t, [1, 0]), B_OP)


@gluon.jit
def _values_operand(words):
    """[32 keys, 16 words] codes (V_WORDS) -> the B operand [32 keys, 64 columns] float16, column
    8j + g holding dimension 8g + j."""
    even, odd = gl.split(gl.permute(gl.reshape(words, [TILE // 2, 2, HEAD_DIM // 4]), [0, 2, 1]))
    # Output j at [k, 2g + e] (the pair packed in one register): key 2k + e, dimension 8g + j.
    o = gl.inline_asm_elementwise(V_PTX, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r", [even, odd],
                                  dtype=(gl.float16,) * 8, is_pure=True, pack=2)
    t = gl.join(gl.join(gl.join(o[0], o[1]), gl.join(o[2], o[3])), gl.join(gl.join(o[4], o[5]), gl.join(o[6], o[7])))
    t = gl.reshape(t, [TILE // 2, 8, 2, 2, 2, 2])  # [k, g, e, j0, j1, j2]
    t = gl.reshape(gl.permute(t, [0, 2, 5, 4, 3, 1]), [TILE, HEAD_DIM])  # [2k + e, 8j + g]
    return gl.convert_layout(t, B_OP)


@gluon.jit
def _keys(LAYOUT: gl.constexpr, DIM: gl.constexpr, blk0, blk1, tile, lo, end, kvh, stride_b, stride_s, stride_h):
    """The trip's 32 keys as a slice of LAYOUT (removing DIM): each one's offset in a tensor of
    [block, slot, kv head] strides, and whether it lies in [lo, end)."""
    key = gl.arange(0, TILE, layout=gl.SliceLayout(DIM, LAYOUT))
    rows = gl.where(key < BLOCK_SIZE, blk0, blk1) * stride_b + (key % BLOCK_SIZE) * stride_s + kvh * stride_h
    return rows, (tile + key >= lo) & (tile + key < end)


@gluon.jit
def _tile(k_ptr, v_ptr, ks_ptr, vs_ptr, bt_row, tile, lo, end, kvh,
          stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_sb, stride_ss, stride_sh):
    """The codes, scales and mask of the 32 keys from `tile` (a block boundary): masked off outside
    [lo, end), so a trip past the end loads nothing."""
    # Offsets in 32 bits (launch_fp8_decode checks that the cache's words fit).
    blk0 = gl.load(bt_row + tile // BLOCK_SIZE, mask=tile < end, other=0)
    blk1 = gl.load(bt_row + tile // BLOCK_SIZE + 1, mask=tile + BLOCK_SIZE < end, other=0)

    k_rows, k_ok = _keys(K_WORDS, 1, blk0, blk1, tile, lo, end, kvh, stride_kb, stride_ks, stride_kh)
    kw = gl.arange(0, HEAD_DIM // 4, layout=gl.SliceLayout(0, K_WORDS))
    k_words = gl.load(k_ptr + k_rows[:, None] + kw[None, :], mask=k_ok[:, None], other=0)
    v_rows, v_ok = _keys(V_WORDS, 1, blk0, blk1, tile, lo, end, kvh, stride_vb, stride_vs, stride_vh)
    vw = gl.arange(0, HEAD_DIM // 4, layout=gl.SliceLayout(0, V_WORDS))
    v_words = gl.load(v_ptr + v_rows[:, None] + vw[None, :], mask=v_ok[:, None], other=0)
    s_rows, s_ok = _keys(MMA, 0, blk0, blk1, tile, lo, end, kvh, stride_sb, stride_ss, stride_sh)
    k_scale = gl.load(ks_ptr + s_rows, mask=s_ok, other=0.0).to(gl.float32)
    v_scale = gl.load(vs_ptr + s_rows, mask=s_ok, other=0.0).to(gl.float32)
    return k_words, v_words, k_scale, v_scale, s_ok


@gluon.jit
def _trip(q, k_words, v_words, k_scale, v_scale, ok, m_i, l_i, acc, ref, scale_log2e):
    """One trip's online softmax (the exp2 domain), rescaling lazily: the kept maxima m_i move only
    where a row's maximum here is more than 2^RESCALE_LOG2 above them, so p is at most 2^RESCALE_LOG2;
    acc holds the weighted values in units of `ref`, the largest value scale seen (0 before any),
    so that p times the scales divided by it fits float16 and the MMA adds into acc directly. Both
    change together, in a branch most trips skip. A trip with no key changes nothing."""
    scores = mma_v2(q, _keys_operand(k_words), gl.zeros([16, TILE], gl.float32, MMA))
    scores = gl.where(ok[None, :], scores * (k_scale * scale_log2e)[None, :], float("-inf"))
    m_tile = gl.max(scores, 1)
    v_max = gl.max(v_scale, 0)
    if (gl.max(m_tile - m_i, 0) > RESCALE_LOG2) | (v_max > ref):
        m_new = gl.maximum(m_i, m_tile)
        ref_new = gl.maximum(ref, v_max)
        alpha = gl.exp2(m_i - m_new)
        acc = acc * (alpha * (ref / ref_new))[:, None]
        l_i = l_i * alpha
        m_i = m_new
        ref = ref_new
    p = gl.exp2(scores - m_i[:, None])
    l_i = l_i + gl.sum(p, 1)
    inv_ref = 1.0 / gl.where(ref == 0.0, 1.0, ref)
    weights = gl.convert_layout((p * (v_scale * inv_ref)[None, :]).to(gl.float16), A_OP, assert_trivial=True)
    return m_i, l_i, mma_v2(weights, _values_operand(v_words), acc), ref


@gluon.jit(do_not_specialize=["window", "stride_bt"])
def _fp8_decode_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, sinks_ptr, qsl_ptr, seq_lens_ptr, bt_ptr, ks_ptr, vs_ptr,
    part_acc_ptr, part_m_ptr, part_l_ptr,  # as decode_triton._decode_kernel's (NUM_SPLITS > 1)
    scale_log2e, window,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,  # 32-bit words
    stride_bt, stride_sb, stride_ss, stride_sh,
    NUM_HEADS: gl.constexpr, GROUP: gl.constexpr, HAS_WINDOW: gl.constexpr, NUM_SPLITS: gl.constexpr,
    PDL: gl.constexpr,
):
    b = gl.program_id(0)
    kvh = gl.program_id(1)
    s = gl.program_id(2)
    q_row = gl.load(qsl_ptr + b)
    if gl.load(qsl_ptr + b + 1) != q_row + 1:  # no query, or a prompt chunk (decode_triton.py)
        return
    seq_len = gl.load(seq_lens_ptr + b)
    hi = seq_len
    if HAS_WINDOW:
        lo = gl.maximum(seq_len - window, 0)
    else:
        lo = seq_len * 0
    first = lo // BLOCK_SIZE * BLOCK_SIZE  # trips start on block boundaries; keys below lo are masked
    if NUM_SPLITS > 1:
        part = gl.cdiv(gl.cdiv(hi - first, NUM_SPLITS), TILE) * TILE
        start = first + s * part
        end = gl.minimum(start + part, hi)
    else:
        start = first
        end = hi
    pdl_enter_gluon(PDL)

    # The query in the keys' order of the head dimension (module docstring), float16 as fp8_triton.query_f16.
    qr = gl.arange(0, 16, layout=gl.SliceLayout(1, A_OP))
    qd = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, A_OP))
    q_dim = 16 * ((qd >> 1) & 3) + 4 * (qd >> 4) + 2 * ((qd >> 3) & 1) + (qd & 1)
    q = gl.load(q_ptr + q_row.to(gl.int64) * stride_qt + (kvh * GROUP + qr)[:, None] * stride_qh + q_dim[None, :],
                mask=(qr < GROUP)[:, None], other=0.0)
    q = gl.minimum(gl.maximum(q.to(gl.float32), -65504.0), 65504.0).to(gl.float16)

    rows = gl.arange(0, 16, layout=gl.SliceLayout(1, MMA))
    row_ok = rows < GROUP
    head = kvh * GROUP + rows
    if NUM_SPLITS > 1:
        m_i = gl.full([16], -1e30, gl.float32, layout=gl.SliceLayout(1, MMA))  # finite: exp2(-inf - m) = 0
        l_i = gl.full([16], 0.0, gl.float32, layout=gl.SliceLayout(1, MMA))
    else:  # sink-seeded (decode_triton.py)
        m_i = gl.load(sinks_ptr + head, mask=row_ok, other=0.0).to(gl.float32) * LOG2E
        l_i = gl.full([16], 1.0, gl.float32, layout=gl.SliceLayout(1, MMA))
    acc = gl.zeros([16, HEAD_DIM], gl.float32, MMA)

    ref = gl.max(l_i, 0) * 0.0  # acc's unit (_trip); 0 until a value scale is seen

    # Each trip loads the next one's codes while it computes.
    bt_row = bt_ptr + b.to(gl.int64) * stride_bt
    k_w, v_w, k_s, v_s, ok = _tile(k_ptr, v_ptr, ks_ptr, vs_ptr, bt_row, start, lo, end, kvh, stride_kb, stride_ks,
                                   stride_kh, stride_vb, stride_vs, stride_vh, stride_sb, stride_ss, stride_sh)
    for tile in range(start, end, TILE):
        n_kw, n_vw, n_ks, n_vs, n_ok = _tile(k_ptr, v_ptr, ks_ptr, vs_ptr, bt_row, tile + TILE, lo, end, kvh,
                                             stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                                             stride_sb, stride_ss, stride_sh)
        m_i, l_i, acc, ref = _trip(q, k_w, v_w, k_s, v_s, ok, m_i, l_i, acc, ref, scale_log2e)
        k_w, v_w, k_s, v_s, ok = n_kw, n_vw, n_ks, n_vs, n_ok
    acc = acc * ref

    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, MMA))
    dim = 8 * (cols % 8) + cols // 8  # column 8j + g is dimension 8g + j
    if NUM_SPLITS > 1:
        part_row = (b * NUM_HEADS + head) * NUM_SPLITS + s
        gl.store(part_acc_ptr + part_row[:, None] * HEAD_DIM + dim[None, :], acc, mask=row_ok[:, None])
        gl.store(part_m_ptr + part_row, m_i, mask=row_ok)
        gl.store(part_l_ptr + part_row, l_i, mask=row_ok)
    else:
        out = acc / l_i[:, None]
        gl.store(o_ptr + q_row.to(gl.int64) * stride_ot + head[:, None] * stride_oh + dim[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])


def supported(device: torch.device, head_dim: int, block_size: int, group: int) -> bool:
    """Whether this kernel may read a decode's FP8 cache: the Hopper kernel policy (ops/policy.py: sm_90,
    not forced portable) and gpt-oss's shapes (head_dim 64, 16-slot blocks, a GQA group of at most
    16 heads)."""
    return device.type == "cuda" and kernel_policy(device).hopper and head_dim == HEAD_DIM.value \
        and block_size == BLOCK_SIZE.value and group <= 16


def launch_fp8_decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k_scales: torch.Tensor,
    v_scales: torch.Tensor, sinks: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
    block_tables: torch.Tensor, scale: float, window: int | None, out: torch.Tensor, num_splits: int,
    part_acc: torch.Tensor, part_m: torch.Tensor, part_l: torch.Tensor, pdl: bool,
) -> None:
    """One launch over (sequence, kv head, split); with num_splits > 1 it writes the partials that
    decode_triton.py's merge kernel reduces."""
    num_seqs, num_heads, kv_heads = seq_lens.shape[0], q.shape[1], k_cache.shape[2]
    k_words = k_cache.view(torch.uint8).view(torch.int32)
    v_words = v_cache.view(torch.uint8).view(torch.int32)
    assert k_scales.stride() == v_scales.stride()
    assert max(k_words.numel(), v_words.numel(), k_scales.numel()) < 2**31, "32-bit offsets (_tile)"
    _fp8_decode_kernel[(num_seqs, kv_heads, num_splits)](
        q, k_words, v_words, out, sinks, query_start_loc, seq_lens, block_tables, k_scales, v_scales,
        part_acc, part_m, part_l, scale * LOG2E.value, window or 0,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_words.stride(0), k_words.stride(1), k_words.stride(2),
        v_words.stride(0), v_words.stride(1), v_words.stride(2),
        block_tables.stride(0), k_scales.stride(0), k_scales.stride(1), k_scales.stride(2),
        NUM_HEADS=num_heads, GROUP=num_heads // kv_heads, HAS_WINDOW=window is not None,
        NUM_SPLITS=num_splits, PDL=pdl, num_warps=1, launch_pdl=pdl,
    )

