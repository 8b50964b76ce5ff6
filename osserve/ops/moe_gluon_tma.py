"""The small-batch K loop of the Gluon MoE kernels (moe_gluon.py): weights and scales by TMA.

At batch 1 the MoE kernels are bound by the instructions each SM issues per K step, not by DRAM
(NOTES-moe.md, fourteenth session: a program alone on an SM takes 0.17 µs a step, three take 0.6).
The cp.async loop (moe_gluon_loop.py) spends ~90 of its ~210 instructions per warp and step on
copies: per-thread addresses and masks, LDGSTS and the padding ptxas puts around them, the
activations' copy and its proxy fence. Here:
- a K step of a 64-row tile is one contiguous 4 KB run of words and one 256-byte run of scales
  (mxfp4_fragments.py), so one thread copies each with a single bulk tensor copy (TMA) that
  signals the slot's mbarrier;
- the activations of the whole K range (BLOCK_T rows, at most X_STEPS steps: 46 KB for 8 rows of
  2,880) are copied once before the loop, so the loop copies no activations and fences nothing.
The one exception is K's 64-column tail step, whose words are not a TMA box: they are copied with
cp.async as in moe_gluon_loop.py, into a buffer of their own, and waited for with their group.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from osserve.ops.moe_gluon_loop import BLOCK_K, RING_LAYOUT, WORD_LAYOUT, dequant, issue_tail_words
from osserve.ops.mxfp4_fragments import ROW_TILE, STEP_SCALES, STEP_WORDS
from osserve.ops.pdl import pdl_enter_gluon

# The copies' boxes: a step's [64, 16] words as 64 rows of 16 int32; its [64, 4] scales as 16 rows
# of 16 bytes (a box's rows must be 16 bytes or more). No swizzle: shared memory gets them row-major.
WORD_BOX = [ROW_TILE, STEP_WORDS]
SCALE_BOX = [ROW_TILE * STEP_SCALES // 16, 16]
WORD_SMEM = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2))
SCALE_SMEM = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2))
STEP_WORD_ROWS = gl.constexpr(ROW_TILE * STEP_WORDS // 16)  # descriptor rows per K step
STEP_SCALE_ROWS = gl.constexpr(ROW_TILE * STEP_SCALES // 16)
WORD_BYTES = gl.constexpr(ROW_TILE * STEP_WORDS * 4)
SCALE_BYTES = gl.constexpr(ROW_TILE * STEP_SCALES)

# [64 rows, q, 4 scales]: a thread's two rows' 4 scales, the same in the 4 lanes q of a row, so that
# merging (q, scale) gives the [64, 16] WORD_LAYOUT, word 4q + j under scale j.
SCALE_LAYOUT_3D = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 0, 1], [0, 0, 2], [8, 0, 0]],
    lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
    warp_bases=[[16, 0, 0], [32, 0, 0]],
    block_bases=[],
    shape=[64, 4, 4],
))


def descriptors(w: torch.Tensor, s: torch.Tensor) -> tuple[TensorDescriptor, TensorDescriptor]:
    """TMA descriptors of a PreparedExperts' tile-major words and scales (mxfp4_fragments.py), as
    [rows, 16] tables: step k of tile t of expert e starts at row (e * stride_we + t * stride_wt) / 16
    + k * STEP_WORD_ROWS (scales likewise)."""
    assert w.is_contiguous() and s.is_contiguous() and w.dtype == torch.int32 and s.dtype == torch.uint8
    words = w.view(-1, 16)
    scales = s.view(-1, 16)
    return (TensorDescriptor.from_tensor(words, WORD_BOX, WORD_SMEM.value),
            TensorDescriptor.from_tensor(scales, SCALE_BOX, SCALE_SMEM.value))


@gluon.jit
def _scales(s_buf):
    """A slot's [64, 4] E8M0 scales -> [64, 16] bf16x2 words 2^(s - 63) in WORD_LAYOUT (word 4q + j
    of a row takes scale j)."""
    s = s_buf._reinterpret(gl.uint8, [64, 4], RING_LAYOUT).load(gl.SliceLayout(1, SCALE_LAYOUT_3D))
    s16 = (s.to(gl.int32) + 64) << 7  # E8M0 s -> bf16 2^(s + 64 - 127) in both halves
    s32 = gl.expand_dims(s16 | (s16 << 16), 1)  # [64, 1, 4]
    s32 = gl.broadcast(s32, gl.zeros([64, 4, 4], gl.int32, SCALE_LAYOUT_3D))[0]
    return gl.convert_layout(gl.reshape(s32, [64, 16]), WORD_LAYOUT, assert_trivial=True)


@gluon.jit
def _issue(w_desc, s_desc, w_buf, s_buf, tail_buf, bar, wa_ptrs, w_row, s_row, w_mask, word, k0, k_end, K):
    """Start the copies of the K step at k0 (if below k_end) into one slot, by TMA. For K's 64-column
    tail step the words' box (the tail's 2 KB and what follows it) lands in the slot unused, so that
    every step's barrier expects the same bytes; the tail's words go by cp.async into tail_buf
    (committed as their own group)."""
    step = k0 // BLOCK_K
    live = k0 < k_end
    mbarrier.expect(bar, SCALE_BYTES + WORD_BYTES, pred=live)
    tma.async_copy_global_to_shared(s_desc, [s_row + step * STEP_SCALE_ROWS, 0], bar, s_buf, pred=live)
    tma.async_copy_global_to_shared(w_desc, [w_row + step * STEP_WORD_ROWS, 0], bar, w_buf, pred=live)
    if live & (k0 + BLOCK_K > K):
        issue_tail_words(tail_buf, wa_ptrs, step, w_mask, word)
        async_copy.commit_group()


@gluon.jit
def k_loop_tma(w_desc, s_desc, w_row, s_row, wa_ptrs, x_ptrs, x_ok, w_mask, word, kcol, k_start, k_end, K,
               BLOCK_T: gl.constexpr, STAGES: gl.constexpr, X_STEPS: gl.constexpr, PDL: gl.constexpr):
    """k_loop (moe_gluon_loop.py) for one weight matrix, its copies by TMA: the [64, BLOCK_T] float32
    accumulator over [k_start, k_end) (at most X_STEPS steps). w_row, s_row: the tile's first rows in
    the descriptors' tables. PDL: the wait for the predecessor comes after the first STAGES - 1
    steps' weight copies and before the activations'."""
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_T, 16])
    A_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    X_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_T, BLOCK_K], gl.bfloat16)
    w_ring = gl.allocate_shared_memory(gl.int32, [STAGES, 64, 16], WORD_SMEM)
    s_ring = gl.allocate_shared_memory(gl.uint8, [STAGES, 16, 16], SCALE_SMEM)
    tail_buf = gl.allocate_shared_memory(gl.int32, [64, 16], RING_LAYOUT)
    x_all = gl.allocate_shared_memory(gl.bfloat16, [X_STEPS, BLOCK_T, BLOCK_K], X_SMEM)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    fence_async_shared()  # the barriers' initialisation, before the copy engine signals them
    gl.thread_barrier()
    for i in gl.static_range(STAGES - 1):
        _issue(w_desc, s_desc, w_ring.index(i), s_ring.index(i), tail_buf, bars.index(i), wa_ptrs, w_row, s_row,
               w_mask, word, k_start + i * BLOCK_K, k_end, K)
    pdl_enter_gluon(PDL)
    num_steps = gl.cdiv(k_end - k_start, BLOCK_K)
    for j in range(num_steps):
        k0 = k_start + j * BLOCK_K
        async_copy.async_copy_global_to_shared(x_all.index(j), x_ptrs + k0, mask=x_ok & (kcol < k_end - k0)[None, :])
    async_copy.commit_group()
    async_copy.wait_group(0)  # the activations (and a tail step's words among the first steps)
    fence_async_shared()  # ... visible to the MMA (async proxy)
    gl.thread_barrier()

    acc = gl.zeros([64, BLOCK_T], gl.float32, MMA)
    for j in range(num_steps):
        slot = j % STAGES
        gl.thread_barrier()  # every warp is past the step that read the slot refilled next
        nxt = j + STAGES - 1
        _issue(w_desc, s_desc, w_ring.index(nxt % STAGES), s_ring.index(nxt % STAGES), tail_buf,
               bars.index(nxt % STAGES), wa_ptrs, w_row, s_row, w_mask, word, k_start + nxt * BLOCK_K, k_end, K)
        mbarrier.wait(bars.index(slot), (j // STAGES) & 1)
        if k_start + (j + 1) * BLOCK_K > K:  # the tail step: its words came by cp.async
            async_copy.wait_group(0)
            words = tail_buf.load(WORD_LAYOUT)
        else:
            words = w_ring.index(slot)._reinterpret(gl.int32, [64, 16], RING_LAYOUT).load(WORD_LAYOUT)
        a = dequant(words, _scales(s_ring.index(slot)), A_LAYOUT)
        acc = warpgroup_mma(a, x_all.index(j).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=[acc, a])[0]
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))
    return acc
