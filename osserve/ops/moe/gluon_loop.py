"""The K loop of the Gluon MoE kernels (moe/gluon.py): one 64-row weight tile (or two) of 4-bit
experts against BLOCK_T activation rows, from global memory through a cp.async shared-memory ring
into dequantised warpgroup-MMA operands.

- The weights are stored in MMA-fragment order (mxfp4/fragments.py), and each thread copies the
  16 bytes per row that become exactly its own left-operand registers: the dequantised tile needs
  no layout conversion (checked at compile time: `assert_trivial`). They are stored tile-major, so
  a K step of a 64-row tile is one contiguous run of 4 KB (and 256 bytes of scales).
- Each word dequantises with a rotate and a mask per bf16x2 register (DEQUANT_PTX).
- The weights, scales and activations of the next STAGES - 1 K steps are in flight meanwhile.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from osserve.ops.mxfp4.fragments import DEQUANT_PTX as _PTX
from osserve.ops.mxfp4.fragments import ROW_TILE, STEP_SCALES, STEP_WORDS
from osserve.ops.pdl import pdl_enter_gluon

DEQUANT_PTX = gl.constexpr(_PTX)
BLOCK_K = gl.constexpr(128)  # K per step
# The tile-major layout (mxfp4/fragments.py): a row's K step is ROW_W words and ROW_S scales, a
# 64-row tile's K step STEP_W words and STEP_S scales.
ROW_W = gl.constexpr(STEP_WORDS)
ROW_S = gl.constexpr(STEP_SCALES)
STEP_W = gl.constexpr(ROW_TILE * STEP_WORDS)
STEP_S = gl.constexpr(ROW_TILE * STEP_SCALES)

# [64 rows, 16 words] of a K step: a thread holds rows g, g+8 of its warp's 16 and words 4q..4q+3.
WORD_LAYOUT = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 1], [0, 2], [8, 0]],
    lane_bases=[[0, 4], [0, 8], [1, 0], [2, 0], [4, 0]],
    warp_bases=[[16, 0], [32, 0]],
    block_bases=[],
    shape=[64, 16],
))


@gluon.jit
def dequant(words, scales, A_LAYOUT: gl.constexpr):
    """[64, 16] int32 words + their groups' bf16x2 scales -> [64, 128] bf16 in the MMA's A layout.

    The asm takes two words per call (jw = 0, 1) and returns eight bf16x2 registers, output
    j = 4 jw + 2 jx + jy holding columns 64 b2 + 32 jw + 16 jx + 8 jy + 2 q + (0, 1)."""
    o = gl.inline_asm_elementwise(
        DEQUANT_PTX, "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r", [words, scales],
        dtype=(gl.bfloat16,) * 8, is_pure=True, pack=2)
    # join: [64, 16, jy, jx, jw]; the 16 words are (q, b2, pair position) and the pair position is e
    t = gl.join(gl.join(gl.join(o[0], o[1]), gl.join(o[2], o[3])), gl.join(gl.join(o[4], o[5]), gl.join(o[6], o[7])))
    t = gl.reshape(t, [64, 4, 2, 2, 2, 2, 2])  # [row, q, b2, e, jy, jx, jw]
    t = gl.permute(t, [0, 2, 6, 5, 4, 1, 3])  # [row, b2, jw, jx, jy, q, e]
    t = gl.reshape(t, [64, 128])
    return gl.convert_layout(t, A_LAYOUT, assert_trivial=True)


# Shared-memory ring of the weights: each thread reads back only what its own copies wrote, so a
# plain row-major layout serves (16-byte reads by 8 threads of a phase hit 8 distinct bank groups).
RING_LAYOUT = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))


@gluon.jit
def _issue_full_words(wa_ring, wb_ring, slot, wa_ptrs, b_off_w, step, mask, TWO: gl.constexpr):
    """The copies of a full K step's words (16 a row) into ring slot `slot`."""
    async_copy.async_copy_global_to_shared(wa_ring.index(slot), wa_ptrs + step * STEP_W, mask=mask)
    if TWO:
        async_copy.async_copy_global_to_shared(wb_ring.index(slot), wa_ptrs + b_off_w + step * STEP_W, mask=mask)


@gluon.jit
def _issue_weights(wa_ring, wb_ring, sa_ring, sb_ring, slot, wa_ptrs, sa_ptrs, b_off_w, b_off_s, w_mask, word, k0,
                   k_end, K, TWO: gl.constexpr, PLAIN: gl.constexpr):
    """Start the copies of the weights and scales of the K step at k0 into ring slot `slot` (masked off
    past k_end). K's 64-column tail step holds 8 words per row (word 4q + 2 b2 + jw of a full step is
    word 2q + jw there): it is copied word by word into the full-step places, b2 = 1 zero-filled, so
    its consumer is the same. PLAIN: the step's 128 columns all lie before k_end, so neither the mask
    past k_end nor the tail path is compiled in."""
    step = k0 // 128
    s_mask = w_mask if PLAIN else w_mask & (k0 < k_end)
    async_copy.async_copy_global_to_shared(sa_ring.index(slot), sa_ptrs + step * STEP_S, mask=s_mask)
    if TWO:
        async_copy.async_copy_global_to_shared(sb_ring.index(slot), sa_ptrs + b_off_s + step * STEP_S, mask=s_mask)
    # (PLAIN as its own branch: `full = True if PLAIN else k0 + 128 <= K; if full:` crashes Triton
    # 3.6's LLVM lowering.)
    if PLAIN:
        _issue_full_words(wa_ring, wb_ring, slot, wa_ptrs, b_off_w, step, s_mask, TWO)
    elif k0 + 128 <= K:
        _issue_full_words(wa_ring, wb_ring, slot, wa_ptrs, b_off_w, step, s_mask, TWO)
    else:
        # the tail step's rows are 8 words long: row r's words start 8 r, not 16 r, after the full steps
        row = gl.arange(0, 64, layout=gl.SliceLayout(1, WORD_LAYOUT))
        tail_off = step * STEP_W - (row * (ROW_W // 2))[:, None] + ((word // 4) * 2 + word % 2 - word)[None, :]
        t_mask = s_mask & ((word // 2) % 2 == 0)[None, :]
        async_copy.async_copy_global_to_shared(wa_ring.index(slot), wa_ptrs + tail_off, mask=t_mask)
        if TWO:
            async_copy.async_copy_global_to_shared(wb_ring.index(slot), wa_ptrs + b_off_w + tail_off, mask=t_mask)


@gluon.jit
def _issue_x(x_ring, slot, x_ptrs, x_ok, kcol, k0, k_end, PLAIN: gl.constexpr):
    """Start the copy of the activations of the K step at k0 into ring slot `slot` (PLAIN: as
    _issue_weights', no mask past k_end)."""
    mask = gl.broadcast(x_ok, x_ptrs)[0] if PLAIN else x_ok & (kcol < k_end - k0)[None, :]
    async_copy.async_copy_global_to_shared(x_ring.index(slot), x_ptrs + k0, mask=mask)


@gluon.jit
def _ring_wait(STAGES: gl.constexpr):
    async_copy.wait_group(STAGES - 2)  # this step's copies (this thread's) are done
    fence_async_shared()  # ... and visible to the MMA (async proxy)
    gl.thread_barrier()  # ... everyone's; and every warp is past the MMA that read the slot refilled next


@gluon.jit
def _ring_scales(s_ring, slot):
    s = s_ring.index(slot).load(WORD_LAYOUT)
    s16 = (s.to(gl.int32) + 64) << 7  # E8M0 s -> bf16 2^(s + 64 - 127) in both halves
    return s16 | (s16 << 16)


@gluon.jit
def _mma_step(wa_ring, wb_ring, sa_ring, sb_ring, x_ring, slot, acc_a, acc_b, A_LAYOUT: gl.constexpr,
              TWO: gl.constexpr):
    """Ring slot `slot`'s weights dequantised and multiplied into the accumulators (the second
    matrix's dequantisation overlapping the first's MMA), waited for."""
    xs = x_ring.index(slot).permute((1, 0))
    a = dequant(wa_ring.index(slot).load(WORD_LAYOUT), _ring_scales(sa_ring, slot), A_LAYOUT)
    acc_a = warpgroup_mma(a, xs, acc_a, is_async=True)
    if TWO:
        b = dequant(wb_ring.index(slot).load(WORD_LAYOUT), _ring_scales(sb_ring, slot), A_LAYOUT)
        acc_b = warpgroup_mma(b, xs, acc_b, is_async=True)
        acc_a, acc_b = warpgroup_mma_wait(0, deps=[acc_a, acc_b, a, b])[:2]
    else:
        acc_a = warpgroup_mma_wait(0, deps=[acc_a, a])[0]
    return acc_a, acc_b


@gluon.jit
def k_loop(wa_ptrs, sa_ptrs, b_off_w, b_off_s, x_ptrs, x_ok, w_mask, word, kcol, k_start, k_end, K,
            BLOCK_T: gl.constexpr, TWO: gl.constexpr, STAGES: gl.constexpr, PDL: gl.constexpr):
    """The K loop over [k_start, k_end) of one or two weight matrices (the second at b_off_w words /
    b_off_s scale bytes from the first) against the [BLOCK_T, K] activation rows at x_ptrs. Each
    step's weights, scales and activations are copied (cp.async) into a STAGES-deep shared-memory
    ring, STAGES - 1 steps ahead of their use; the weights go from there into registers, are
    dequantised and multiplied by one async MMA per matrix, the second matrix's dequantisation
    overlapping the first's MMA. Returns the [64, BLOCK_T] float32 accumulators in the MMA layout.
    PDL: the loop holds the kernel's wait for its predecessor (ops/pdl.py), after the first STAGES - 1
    steps' weights and before their activations: the weights' first round trip overlaps the
    predecessor's end.

    (Keeping a step's last MMA in flight into the next step made ptxas serialise every wgmma: C7515,
    the loop-carried accumulator is copied while the MMA runs.)"""
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_T, 16])
    A_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    X_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_T, BLOCK_K], gl.bfloat16)
    wa_ring = gl.allocate_shared_memory(gl.int32, [STAGES, 64, 16], RING_LAYOUT)
    sa_ring = gl.allocate_shared_memory(gl.uint8, [STAGES, 64, 16], RING_LAYOUT)
    wb_ring, sb_ring = wa_ring, sa_ring
    if TWO:
        wb_ring = gl.allocate_shared_memory(gl.int32, [STAGES, 64, 16], RING_LAYOUT)
        sb_ring = gl.allocate_shared_memory(gl.uint8, [STAGES, 64, 16], RING_LAYOUT)
    x_ring = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_T, BLOCK_K], X_SMEM)
    acc_a = gl.zeros([64, BLOCK_T], gl.float32, MMA)
    acc_b = gl.zeros([64, BLOCK_T], gl.float32, MMA)

    for i in gl.static_range(STAGES - 1):
        _issue_weights(wa_ring, wb_ring, sa_ring, sb_ring, i, wa_ptrs, sa_ptrs, b_off_w, b_off_s, w_mask, word,
                       k_start + i * BLOCK_K, k_end, K, TWO, False)
        if not PDL:
            _issue_x(x_ring, i, x_ptrs, x_ok, kcol, k_start + i * BLOCK_K, k_end, False)
            async_copy.commit_group()
    if PDL:
        pdl_enter_gluon(True)
        for i in gl.static_range(STAGES - 1):  # the first group also holds all of the weights above
            _issue_x(x_ring, i, x_ptrs, x_ok, kcol, k_start + i * BLOCK_K, k_end, False)
            async_copy.commit_group()
    num_steps = gl.cdiv(k_end - k_start, BLOCK_K)
    num_plain = 0
    if BLOCK_T >= 16:
        # The plain steps: the step they copy is a whole 128 columns before k_end, so the copies need
        # no K mask and no tail path (~20 fewer instructions a step; the last STAGES - 1 steps keep
        # them): 120b T=256 626 -> 595 us a layer on an H200 (NOTES-moe.md). Not at 8-token tiles:
        # there the second loop takes registers from 71 to 79, one of an SM's 7 programs, which was
        # not measured.
        num_plain = gl.maximum((k_end - k_start) // BLOCK_K - (STAGES - 1), 0)
        for j in range(num_plain):
            _ring_wait(STAGES)
            nxt = j + STAGES - 1
            _issue_weights(wa_ring, wb_ring, sa_ring, sb_ring, nxt % STAGES, wa_ptrs, sa_ptrs, b_off_w, b_off_s,
                           w_mask, word, k_start + nxt * BLOCK_K, k_end, K, TWO, True)
            _issue_x(x_ring, nxt % STAGES, x_ptrs, x_ok, kcol, k_start + nxt * BLOCK_K, k_end, True)
            async_copy.commit_group()
            acc_a, acc_b = _mma_step(wa_ring, wb_ring, sa_ring, sb_ring, x_ring, j % STAGES, acc_a, acc_b, A_LAYOUT,
                                     TWO)
    for j in range(num_plain, num_steps):
        _ring_wait(STAGES)
        nxt = j + STAGES - 1
        _issue_weights(wa_ring, wb_ring, sa_ring, sb_ring, nxt % STAGES, wa_ptrs, sa_ptrs, b_off_w, b_off_s, w_mask,
                       word, k_start + nxt * BLOCK_K, k_end, K, TWO, False)
        _issue_x(x_ring, nxt % STAGES, x_ptrs, x_ok, kcol, k_start + nxt * BLOCK_K, k_end, False)
        async_copy.commit_group()
        acc_a, acc_b = _mma_step(wa_ring, wb_ring, sa_ring, sb_ring, x_ring, j % STAGES, acc_a, acc_b, A_LAYOUT, TWO)
    async_copy.wait_group(0)
    return acc_a, acc_b


@gluon.jit
def weight_pointers(w_ptr, s_ptr, expert, tile, N, stride_we, stride_wt, stride_se, stride_st, W_LAYOUT: gl.constexpr):
    """Pointers to the first K step of an expert's 64-row tile `tile` (tile-major, mxfp4/fragments.py:
    a step is [64 rows, 16 words] and [64 rows, 4 scales]): words [64, 16], each word's scale, and the
    row mask (rows < N)."""
    row = gl.arange(0, 64, layout=gl.SliceLayout(1, W_LAYOUT))
    word = gl.arange(0, 16, layout=gl.SliceLayout(0, W_LAYOUT))
    w_mask = (tile * 64 + row < N)[:, None] & (word >= 0)[None, :]
    tile = tile.to(gl.int64)
    w_ptrs = w_ptr + expert * stride_we + tile * stride_wt + (row * ROW_W)[:, None] + word[None, :]
    s_ptrs = s_ptr + expert * stride_se + tile * stride_st + (row * ROW_S)[:, None] + (word % 4)[None, :]
    return w_ptrs, s_ptrs, w_mask, word
