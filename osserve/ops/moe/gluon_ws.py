"""The warp-specialized K loop of the Gluon MoE kernels (moe/gluon.py), for one 64-row weight tile: a
copy warp fills the shared-memory ring, and the MMA warpgroup only dequantises and multiplies.

At small batches the MoE kernels are bound by what an SM issues per K step and by each step's
chain of waits (NOTES-moe.md, the 2026-11-24 sections on the K loop). In k_loop (moe/gluon_loop.py) each
of the warpgroup's threads also issues its share of the copies (per-thread addresses and masks,
cp.async, the group wait, the CTA barriers the ring needs), and every warp waits for them. Here one
extra warp does all of the copying:
- a K step's words (one contiguous 4 KB run, mxfp4/fragments.py) and scales (256 bytes) by two bulk
  tensor copies (TMA); K's 64-column tail step's words, a [64, 8] block of their own, by a third,
  into a buffer of their own;
- the step's activation rows by cp.async (they are gathered by token, so not a TMA box).
A slot's `ready` mbarrier completes once all of them have landed; the warpgroup waits on it, reads
the words and scales into registers, multiplies, and hands the slot back through its `empty` one.
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

from osserve.ops.moe.gluon_loop import BLOCK_K, RING_LAYOUT, WORD_LAYOUT, dequant
from osserve.ops.mxfp4.fragments import ROW_TILE, STEP_SCALES, STEP_WORDS
from osserve.ops.pdl import pdl_enter_gluon

# The copies' boxes: a step's [64, 16] words as 64 rows of 16 int32, the tail step's [64, 8] as 64
# rows of 8, its [64, 4] scales as 16 rows of 16 bytes (a box's rows must be 16 bytes or more). No
# swizzle: shared memory gets them row-major, as RING_LAYOUT reads them.
WORD_BOX = [ROW_TILE, STEP_WORDS]
TAIL_BOX = [ROW_TILE, STEP_WORDS // 2]
SCALE_BOX = [ROW_TILE * STEP_SCALES // 16, 16]
WORD_SMEM = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2))
SCALE_SMEM = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2))
# Table rows of one K step (words: 16 a row; tail words: 8; scales: 16 bytes), and a full step's words.
WORD_ROWS = gl.constexpr(ROW_TILE * STEP_WORDS // 16)
SCALE_ROWS = gl.constexpr(ROW_TILE * STEP_SCALES // 16)
STEP_W = gl.constexpr(ROW_TILE * STEP_WORDS)
STEP_BYTES = gl.constexpr(ROW_TILE * (STEP_WORDS * 4 + STEP_SCALES))  # a full step's words and scales
TAIL_BYTES = gl.constexpr(ROW_TILE * (STEP_WORDS * 2 + STEP_SCALES))  # the tail step's
COPY_WARPS = gl.constexpr(1)
COPY_REGS = gl.constexpr(48)
# Registers per thread at launch (the kernels' `maxnreg`). Registers are allotted by warpgroup, so a
# program is 8 warps (the MMA warpgroup, then the copy warp and three idle ones): 8 x 32 x 80 = 20,480
# registers, three programs an SM. The compiler then moves registers from the idle and copy warps to
# the MMA warpgroup (setmaxnreg: 112 there, 48 for the copy warp), with no spills at 8- and 16-token tiles.
MAX_REGISTERS = 80
# [BLOCK_T, 128] activations as the copy warp holds them: 16 bytes a thread, two rows a pass.
X_COPY_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 8], [2, 16], [1, 1], [1, 0]))
# The tail step's [64, 8] words in WORD_LAYOUT's places for b2 = 0 (word 2q + jw there is 4q + jw).
TAIL_LAYOUT = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 1], [8, 0]],
    lane_bases=[[0, 2], [0, 4], [1, 0], [2, 0], [4, 0]],
    warp_bases=[[16, 0], [32, 0]],
    block_bases=[],
    shape=[64, 8],
))


def descriptors(w: torch.Tensor, s: torch.Tensor) -> tuple[TensorDescriptor, TensorDescriptor, TensorDescriptor]:
    """TMA descriptors of a PreparedExperts' tile-major words and scales (mxfp4/fragments.py) as
    tables of 16 words, 8 words (tail steps) and 16 scale bytes a row."""
    assert w.is_contiguous() and s.is_contiguous() and w.dtype == torch.int32 and s.dtype == torch.uint8
    assert w.numel() < 2**31 and s.numel() < 2**31, "the kernels' word and scale offsets are int32"
    return (TensorDescriptor.from_tensor(w.view(-1, STEP_WORDS), WORD_BOX, WORD_SMEM.value),
            TensorDescriptor.from_tensor(w.view(-1, STEP_WORDS // 2), TAIL_BOX, WORD_SMEM.value),
            TensorDescriptor.from_tensor(s.view(-1, 16), SCALE_BOX, SCALE_SMEM.value))


@gluon.jit
def _issue_weights(w_desc, t_desc, s_desc, word0, scale0, step, full_steps, w_ring, t_buf, s_ring, bar):
    """Start the TMA copies of K step `step`'s words and scales (the tail step's words into t_buf)."""
    if step < full_steps:
        mbarrier.expect(bar, STEP_BYTES)
        tma.async_copy_global_to_shared(w_desc, [word0 // 16 + step * WORD_ROWS, 0], bar, w_ring)
    else:
        mbarrier.expect(bar, TAIL_BYTES)
        tma.async_copy_global_to_shared(t_desc, [(word0 + full_steps * STEP_W) // 8, 0], bar, t_buf)
    tma.async_copy_global_to_shared(s_desc, [scale0 // 16 + step * SCALE_ROWS, 0], bar, s_ring)


@gluon.jit
def _copy_partition(w_desc, t_desc, s_desc, word0, scale0, x_ptr, stride_xm, sorted_ptr, pid_t, num_slots,
                    k_start, k_end, K, w_ring, t_buf, s_ring, x_ring, ready, empty,
                    BLOCK_T: gl.constexpr, TOP_K: gl.constexpr, STAGES: gl.constexpr, PDL: gl.constexpr):
    """The copy warp. word0 / scale0: the tile's first word and scale byte in the expert tensors.
    Activation rows: the plan's token tile pid_t, gathered by token (x row = slot // TOP_K), or with
    TOP_K = 0 the plan rows themselves. PDL: the wait for the predecessor comes after the first
    STAGES steps' weight copies and before any activation copy."""
    r = gl.arange(0, BLOCK_T, layout=gl.SliceLayout(1, X_COPY_LAYOUT))
    plan_row = pid_t * BLOCK_T + r
    slot = gl.load(sorted_ptr + plan_row)
    row_ok = (slot < num_slots)[:, None]
    if TOP_K > 0:
        x_row = slot // TOP_K
    else:
        x_row = plan_row
    kcol = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, X_COPY_LAYOUT))
    x_ptrs = x_ptr + (x_row.to(gl.int64) * stride_xm)[:, None] + kcol[None, :]
    num_steps = gl.cdiv(k_end - k_start, BLOCK_K)
    full_steps = K // BLOCK_K
    step0 = k_start // BLOCK_K

    # The first STAGES steps' weights (every slot starts free), then (PDL) the wait, then their
    # activations; after that, each step's weights and activations once its slot is free again.
    for first in gl.static_range(STAGES):
        if first < num_steps:
            _issue_weights(w_desc, t_desc, s_desc, word0, scale0, step0 + first, full_steps, w_ring.index(first),
                           t_buf, s_ring.index(first), ready.index(first))
    pdl_enter_gluon(PDL)
    for j in range(num_steps):
        i = j % STAGES
        if j >= STAGES:
            mbarrier.wait(empty.index(i), ((j // STAGES) & 1) ^ 1)  # step j - STAGES's MMA is done
            _issue_weights(w_desc, t_desc, s_desc, word0, scale0, step0 + j, full_steps, w_ring.index(i), t_buf,
                           s_ring.index(i), ready.index(i))
        k0 = k_start + j * BLOCK_K
        async_copy.async_copy_global_to_shared(x_ring.index(i), x_ptrs + k0, mask=row_ok & (kcol < k_end - k0)[None, :])
        async_copy.mbarrier_arrive(ready.index(i), increment_count=False)


# Four bf16x2 scales 2^(s_j - 63) from one word of four E8M0 bytes s_j (pack=4: the four are a row's
# scales j = 0..3 in register order, so $4 is the row's word): byte j zero-extended, then
# (s + 64) << 7 into both halves.
SCALES_PTX = gl.constexpr("""{
prmt.b32 $0, $4, 0, 0x4440;
mad.lo.u32 $0, $0, 0x00800080, 0x20002000;
prmt.b32 $1, $4, 0, 0x4441;
mad.lo.u32 $1, $1, 0x00800080, 0x20002000;
prmt.b32 $2, $4, 0, 0x4442;
mad.lo.u32 $2, $2, 0x00800080, 0x20002000;
prmt.b32 $3, $4, 0, 0x4443;
mad.lo.u32 $3, $3, 0x00800080, 0x20002000;
}""")


@gluon.jit
def _scales(s_buf):
    """A slot's [64, 4] E8M0 scales -> [64, 16] bf16x2 scales in WORD_LAYOUT: word 4q + j of a row takes
    the row's scale j, so a thread reads each of its two rows' four bytes as one word."""
    row_words = s_buf._reinterpret(gl.int32, [64], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    sw = gl.expand_dims(row_words.load(gl.SliceLayout(1, WORD_LAYOUT)), 1)  # [64, 1]
    sw = gl.broadcast(sw, gl.zeros([64, 16], gl.int32, WORD_LAYOUT))[0]
    return gl.inline_asm_elementwise(SCALES_PTX, "=r,=r,=r,=r,r,r,r,r", [sw], dtype=gl.int32, is_pure=True, pack=4)


@gluon.jit
def _operand(w_ring, t_buf, s_ring, ready, j, STAGES: gl.constexpr, A_LAYOUT: gl.constexpr, TAIL: gl.constexpr):
    """Step j's dequantised weights, once its slot is ready. TAIL: K's 64-column tail step, whose
    [64, 8] words are in t_buf (b2 = 1 zero)."""
    i = j % STAGES
    mbarrier.wait(ready.index(i), (j // STAGES) & 1)
    if TAIL:
        t = t_buf._reinterpret(gl.int32, [64, 8], RING_LAYOUT).load(TAIL_LAYOUT)
        t = gl.reshape(t, [64, 4, 2])  # [row, q, jw]
        t = gl.permute(gl.join(t, gl.zeros_like(t)), [0, 1, 3, 2])  # [row, q, b2, jw]
        words = gl.convert_layout(gl.reshape(t, [64, 16]), WORD_LAYOUT, assert_trivial=True)
    else:
        words = w_ring.index(i)._reinterpret(gl.int32, [64, 16], RING_LAYOUT).load(WORD_LAYOUT)
    scales = _scales(s_ring.index(i))
    # The activations came by cp.async (generic proxy) and the MMA reads them (async proxy); the
    # reads above must be done before the slot's next TMA (async proxy) overwrites it.
    fence_async_shared()
    return dequant(words, scales, A_LAYOUT)


@gluon.jit
def _mma_partition(w_ring, t_buf, s_ring, x_ring, ready, empty, k_start, k_end, K,
                   BLOCK_T: gl.constexpr, STAGES: gl.constexpr):
    """The MMA warpgroup: the [64, BLOCK_T] float32 accumulator over [k_start, k_end). Steps go in
    pairs: the second is dequantised while the first's MMA runs (the accumulator is not left in
    flight across the loop's back edge, where ptxas would serialise the MMAs: NOTES-moe.md)."""
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_T, 16])
    A_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    acc = gl.zeros([64, BLOCK_T], gl.float32, MMA)
    full_end = gl.minimum(k_end, K // BLOCK_K * BLOCK_K)
    num_full = gl.cdiv(gl.maximum(full_end - k_start, 0), BLOCK_K)
    for j in range(0, num_full - 1, 2):
        a = _operand(w_ring, t_buf, s_ring, ready, j, STAGES, A_LAYOUT, False)
        acc = warpgroup_mma(a, x_ring.index(j % STAGES).permute((1, 0)), acc, is_async=True)
        b = _operand(w_ring, t_buf, s_ring, ready, j + 1, STAGES, A_LAYOUT, False)
        acc = warpgroup_mma(b, x_ring.index((j + 1) % STAGES).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=[acc, a, b])[0]
        mbarrier.arrive(empty.index(j % STAGES), count=1)
        mbarrier.arrive(empty.index((j + 1) % STAGES), count=1)
    if num_full % 2 == 1:
        j = num_full - 1
        a = _operand(w_ring, t_buf, s_ring, ready, j, STAGES, A_LAYOUT, False)
        acc = warpgroup_mma(a, x_ring.index(j % STAGES).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=[acc, a])[0]
        mbarrier.arrive(empty.index(j % STAGES), count=1)
    if k_end > full_end:  # the tail step (the last; no slot to hand back)
        a = _operand(w_ring, t_buf, s_ring, ready, num_full, STAGES, A_LAYOUT, True)
        acc = warpgroup_mma(a, x_ring.index(num_full % STAGES).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=[acc, a])[0]
    return (acc,)  # warp_specialize takes the default partition's results as a tuple


@gluon.jit
def k_loop_ws(w_desc, t_desc, s_desc, word0, scale0, x_ptr, stride_xm, sorted_ptr, pid_t, num_slots,
              k_start, k_end, K, BLOCK_T: gl.constexpr, TOP_K: gl.constexpr, STAGES: gl.constexpr,
              PDL: gl.constexpr):
    """moe_gluon_loop.k_loop for one weight tile, with a copy warp (module docstring): the [64, BLOCK_T]
    float32 accumulator in the MMA layout. The descriptors are `descriptors(w, s)`; word0 and scale0
    the tile's first word and scale byte; the activation rows as in _copy_partition."""
    X_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_T, BLOCK_K], gl.bfloat16)
    w_ring = gl.allocate_shared_memory(gl.int32, [STAGES, 64, 16], WORD_SMEM)
    t_buf = gl.allocate_shared_memory(gl.int32, [64, 8], WORD_SMEM)
    s_ring = gl.allocate_shared_memory(gl.uint8, [STAGES, 16, 16], SCALE_SMEM)
    x_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_T, BLOCK_K], X_SMEM)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        # ready: the expect's arrival and one per copy-warp thread when its activation copies land
        mbarrier.init(ready.index(i), count=1 + 32 * COPY_WARPS)
        mbarrier.init(empty.index(i), count=1)
    fence_async_shared()  # the barriers' initialisation, before the copy engine signals them
    acc = gl.warp_specialize([
        (_mma_partition, (w_ring, t_buf, s_ring, x_ring, ready, empty, k_start, k_end, K, BLOCK_T, STAGES)),
        (_copy_partition, (w_desc, t_desc, s_desc, word0, scale0, x_ptr, stride_xm, sorted_ptr, pid_t, num_slots,
                           k_start, k_end, K, w_ring, t_buf, s_ring, x_ring, ready, empty, BLOCK_T, TOP_K, STAGES,
                           PDL)),
    ], [COPY_WARPS], [COPY_REGS])[0]
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
        mbarrier.invalidate(empty.index(i))
    return acc
