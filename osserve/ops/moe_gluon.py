"""Fused MXFP4 MoE on Hopper in Gluon: 4-bit weights dequantised straight into MMA registers.

Same plan as moe_swapped.py (W @ X^T: weights are the warpgroup MMA's left operand, BLOCK_T token
slots its N; routing plan from moe_align.py; split K at small grids; same epilogues), but written
in Gluon, where the register layouts are ours to state:
- the weights are stored in MMA-fragment order (mxfp4_fragments.py), and each thread loads the
  16 bytes per row that become exactly its own left-operand registers: the dequantised tile needs
  no layout conversion (checked at compile time: `assert_trivial`);
- each word dequantises with a rotate and a mask per bf16x2 register (DEQUANT_PTX);
- one 128-deep async MMA per matrix per K step, the up projection's dequantisation overlapping
  the gate's MMA, and the next step's weights, scales and activations in flight meanwhile.
The Triton kernels leave the layouts to the compiler, which staged the weights through shared
memory and waited on each of 2-8 MMAs per K step (NOTES-moe.md).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from osserve.ops import moe_swapped
from osserve.ops.moe import SWIGLU_ALPHA
from osserve.ops.moe_align import RoutingPlan, align_tokens
from osserve.ops.moe_swapped import (
    MAX_TOKENS,
    PROGRAMS_PER_SM,
    SWIGLU_BLOCK_N,
    _swiglu_splits_kernel,
    by_slots,
    down_output,
    split_k,
    sum_experts,
    used_tiles,
)
from osserve.ops.moe_triton import UNSCALE, PreparedExperts
from osserve.ops.mxfp4_fragments import DEQUANT_PTX as _PTX

DEQUANT_PTX = gl.constexpr(_PTX)

BLOCK_W = 64  # weight rows per program: one warpgroup MMA's M
BLOCK_K = gl.constexpr(128)  # K per step
NUM_WARPS = 4


# [BLOCK_T, 128] activation rows (the MMA's right operand before shared memory), and the [64 weight
# rows, BLOCK_T] epilogue tile with the rows fastest (coalesced stores of act / y rows).
X_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0]))
OUT_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 1], [32, 1], [4, 1], [0, 1]))

# [64 rows, 16 words] of a K step: a thread holds rows g, g+8 of its warp's 16 and words 4q..4q+3.
WORD_LAYOUT = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 1], [0, 2], [8, 0]],
    lane_bases=[[0, 4], [0, 8], [1, 0], [2, 0], [4, 0]],
    warp_bases=[[16, 0], [32, 0]],
    block_bases=[],
    shape=[64, 16],
))


@gluon.jit
def _dequant(words, scales, A_LAYOUT: gl.constexpr):
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


@gluon.jit
def _load_step(w_ptrs, s_ptrs, k0, TAIL: gl.constexpr, mask, word):
    """One K step's words and bf16x2 scales. The tail step (64 columns) holds 8 words per row in
    the same order with b2 = 0 only: word 4q + 2 b2 + jw of a full step is word 2q + jw there."""
    step = k0 // 128  # k0 is a multiple of 128: offsets stated so (16-byte / 4-byte vector loads)
    if TAIL:
        tail_word = (word // 4) * 2 + word % 2
        ok = (word // 2) % 2 == 0
        w = gl.load(w_ptrs + step * 16 + (tail_word - word)[None, :], mask=mask & ok[None, :], other=0)
        s = gl.load(s_ptrs + step * 4, mask=mask & ok[None, :], other=0)
    else:
        w = gl.load(w_ptrs + step * 16, mask=mask, other=0)
        s = gl.load(s_ptrs + step * 4, mask=mask, other=0)
    # E8M0 s -> bf16 2^(s + 64 - 127) in both halves
    s16 = (s.to(gl.int32) + 64) << 7
    return w, s16 | (s16 << 16)


@gluon.jit
def _tile_setup(sorted_ptr, block_expert_ptr, pid_t, num_slots, BLOCK_T: gl.constexpr, layout: gl.constexpr):
    expert = gl.load(block_expert_ptr + pid_t).to(gl.int64)
    rows = pid_t * BLOCK_T + gl.arange(0, BLOCK_T, layout=layout)
    slot = gl.load(sorted_ptr + rows)
    return expert, rows, slot, slot < num_slots


@gluon.jit
def _mma_step(wa, sa, wb, sb, b_tile, b_smem, acc_a, acc_b, TWO: gl.constexpr, A_LAYOUT: gl.constexpr):
    """acc_a += dequant(wa, sa) @ b_tile^T (and acc_b with wb, sb when TWO): b_tile goes through shared
    memory (the MMA's right operand); matrix b's dequantisation overlaps matrix a's MMA."""
    b_smem.store(b_tile)
    fence_async_shared()
    a = _dequant(wa, sa, A_LAYOUT)
    acc_a = warpgroup_mma(a, b_smem.permute((1, 0)), acc_a, is_async=True)
    if TWO:
        b = _dequant(wb, sb, A_LAYOUT)
        acc_b = warpgroup_mma(b, b_smem.permute((1, 0)), acc_b, is_async=True)
        acc_a, acc_b = warpgroup_mma_wait(0, deps=[acc_a, acc_b, a, b, b_smem])[:2]
    else:
        acc_a = warpgroup_mma_wait(0, deps=[acc_a, a, b_smem])[0]
    return acc_a, acc_b


@gluon.jit
def _k_loop(wa_ptrs, sa_ptrs, b_off_w, b_off_s, x_ptrs, x_ok, w_mask, word, kcol, k_start, k_end,
            BLOCK_T: gl.constexpr, TWO: gl.constexpr):
    """The K loop over [k_start, k_end) of one or two weight matrices (the second at b_off_w words /
    b_off_s scale bytes from the first) against the [BLOCK_T, K] activation rows at x_ptrs: each
    step's weights, scales and activations are loaded one step ahead of their use. Returns the
    [64, BLOCK_T] float32 accumulators in the MMA layout."""
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_T, 16])
    A_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    X_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_T, BLOCK_K], gl.bfloat16)
    wb_ptrs = wa_ptrs + b_off_w
    sb_ptrs = sa_ptrs + b_off_s
    k_full_end = k_start + ((k_end - k_start) // BLOCK_K) * BLOCK_K
    b_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_T, BLOCK_K], X_SMEM)
    acc_a = gl.zeros([64, BLOCK_T], gl.float32, MMA)
    acc_b = gl.zeros([64, BLOCK_T], gl.float32, MMA)

    first = w_mask & (k_start < k_full_end)
    wa, sa = _load_step(wa_ptrs, sa_ptrs, k_start, False, first, word)
    wb, sb = wa, sa
    if TWO:
        wb, sb = _load_step(wb_ptrs, sb_ptrs, k_start, False, first, word)
    xt = gl.load(x_ptrs + k_start, mask=x_ok & (k_start < k_full_end), other=0.0)
    for k0 in range(k_start, k_full_end, BLOCK_K):
        more = w_mask & (k0 + BLOCK_K < k_full_end)
        wa_n, sa_n = _load_step(wa_ptrs, sa_ptrs, k0 + BLOCK_K, False, more, word)
        wb_n, sb_n = wa_n, sa_n
        if TWO:
            wb_n, sb_n = _load_step(wb_ptrs, sb_ptrs, k0 + BLOCK_K, False, more, word)
        xt_n = gl.load(x_ptrs + (k0 + BLOCK_K), mask=x_ok & (k0 + BLOCK_K < k_full_end), other=0.0)
        acc_a, acc_b = _mma_step(wa, sa, wb, sb, xt, b_smem, acc_a, acc_b, TWO, A_LAYOUT)
        wa, sa, wb, sb, xt = wa_n, sa_n, wb_n, sb_n, xt_n
    if k_full_end < k_end:  # the last 64 columns of a K that is 64 mod 128
        wa, sa = _load_step(wa_ptrs, sa_ptrs, k_full_end, True, w_mask, word)
        wb, sb = wa, sa
        if TWO:
            wb, sb = _load_step(wb_ptrs, sb_ptrs, k_full_end, True, w_mask, word)
        xt = gl.load(x_ptrs + k_full_end, mask=x_ok & (kcol < k_end - k_full_end)[None, :], other=0.0)
        acc_a, acc_b = _mma_step(wa, sa, wb, sb, xt, b_smem, acc_a, acc_b, TWO, A_LAYOUT)
    return acc_a, acc_b


@gluon.jit
def _weight_pointers(w_ptr, s_ptr, expert, pid_w, N, stride_we, stride_wn, stride_se, stride_sn,
                     W_LAYOUT: gl.constexpr):
    """Pointers to row pid_w*64.. of an expert's words [64, 16] and scales (each word's group), and the row mask."""
    wrow = pid_w * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, W_LAYOUT))
    word = gl.arange(0, 16, layout=gl.SliceLayout(0, W_LAYOUT))
    w_mask = (wrow < N)[:, None] & (word >= 0)[None, :]
    # rows of words are 16-byte aligned, rows of scales 4-byte aligned (mxfp4_fragments.py)
    w_row = gl.multiple_of(wrow[:, None].to(gl.int64) * stride_wn, [1, 4])
    s_row = gl.multiple_of(wrow[:, None].to(gl.int64) * stride_sn, [1, 4])
    w_ptrs = w_ptr + expert * stride_we + w_row + word[None, :]
    s_ptrs = s_ptr + expert * stride_se + s_row + (word % 4)[None, :]
    return w_ptrs, s_ptrs, w_mask, word


@gluon.jit
def _program(num_t_blocks, num_splits):
    """(token tile, K split, weight tile) of this program: token tiles fastest, so that neighbours
    share a weight tile (L2 reuse)."""
    pid = gl.program_id(0)
    return pid % num_t_blocks, (pid // num_t_blocks) % num_splits, pid // (num_t_blocks * num_splits)


@gluon.jit
def _out_rows(pid_w, pid_t, N, BLOCK_T: gl.constexpr):
    """The epilogue's weight rows, their mask, and the plan rows of the token tile (OUT_LAYOUT)."""
    orow = pid_w * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, OUT_LAYOUT))
    prow = pid_t * BLOCK_T + gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, OUT_LAYOUT))
    return orow, orow < N, prow


_PER_STEP = ["num_slots", "num_t_blocks", "num_splits"]


@gluon.jit(do_not_specialize=_PER_STEP)
def _gate_up_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, act_ptr, part_ptr,  # x [T, K]; w [E, 2N, K/8] int32; s [E, 2N, Gp] u8; b [E, 2N]
    sorted_ptr, block_expert_ptr, num_padded_ptr,  # act [P, N]; part [S, P, 2N] float32 (split K only)
    num_slots, N, K, num_t_blocks, num_splits, k_per_split, limit,
    stride_xm, stride_we, stride_wn, stride_se, stride_sn, stride_be, stride_am, stride_ps, stride_pm,
    TOP_K: gl.constexpr, BLOCK_T: gl.constexpr, SPLIT: gl.constexpr, ALPHA: gl.constexpr, UNSCALE: gl.constexpr,
):

    pid_t, pid_s, pid_w = _program(num_t_blocks, num_splits)
    if pid_t * BLOCK_T >= gl.load(num_padded_ptr):
        return
    expert, rows, slot, row_ok = _tile_setup(sorted_ptr, block_expert_ptr, pid_t, num_slots, BLOCK_T,
                                             gl.SliceLayout(1, X_LAYOUT))
    token = (slot // TOP_K).to(gl.int64)
    kcol = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, X_LAYOUT))
    x_ptrs = x_ptr + token[:, None] * stride_xm + kcol[None, :]  # [BT, BK]
    w_ptrs, s_ptrs, w_mask, word = _weight_pointers(w_ptr, s_ptr, expert, pid_w, N, stride_we, stride_wn,
                                                    stride_se, stride_sn, WORD_LAYOUT)
    k_start = pid_s * k_per_split
    k_end = gl.minimum(K, k_start + k_per_split)
    acc_g, acc_u = _k_loop(w_ptrs, s_ptrs, N * stride_wn, N * stride_sn, x_ptrs, row_ok[:, None], w_mask, word,
                           kcol, k_start, k_end, BLOCK_T, True)

    acc_g = gl.convert_layout(acc_g * UNSCALE, OUT_LAYOUT)
    acc_u = gl.convert_layout(acc_u * UNSCALE, OUT_LAYOUT)
    orow, o_ok, prow = _out_rows(pid_w, pid_t, N, BLOCK_T)
    p_ok = gl.load(sorted_ptr + prow) < num_slots
    if SPLIT:  # partial sums; moe_swapped's _swiglu_splits_kernel adds them up and applies the epilogue
        p_ptrs = part_ptr + pid_s.to(gl.int64) * stride_ps + prow[None, :].to(gl.int64) * stride_pm + orow[:, None]
        p_mask = o_ok[:, None] & p_ok[None, :]
        gl.store(p_ptrs, acc_g, mask=p_mask)
        gl.store(p_ptrs + N, acc_u, mask=p_mask)
    else:
        bg = gl.load(b_ptr + expert * stride_be + orow, mask=o_ok, other=0.0)
        bu = gl.load(b_ptr + expert * stride_be + N + orow, mask=o_ok, other=0.0)
        gate = gl.minimum(acc_g + bg[:, None], limit)
        up = gl.minimum(gl.maximum(acc_u + bu[:, None], -limit), limit)
        h = gate * (1.0 / (1.0 + gl.exp(-ALPHA * gate))) * (up + 1.0)  # moe.py's clamped SwiGLU
        a_out = act_ptr + prow[None, :].to(gl.int64) * stride_am + orow[:, None]
        gl.store(a_out, h.to(act_ptr.dtype.element_ty), mask=o_ok[:, None] & (prow >= 0)[None, :])


@gluon.jit(do_not_specialize=_PER_STEP)
def _down_kernel(
    act_ptr, w_ptr, s_ptr, b_ptr, y_ptr, topk_w_ptr,  # act [P, K]; w [E, N, K/8] int32; y [S, T*k, N]
    sorted_ptr, block_expert_ptr, num_padded_ptr,
    num_slots, N, K, num_t_blocks, num_splits, k_per_split,
    stride_am, stride_we, stride_wn, stride_se, stride_sn, stride_be, stride_ys, stride_ym,
    BLOCK_T: gl.constexpr, UNSCALE: gl.constexpr,
):

    pid_t, pid_s, pid_w = _program(num_t_blocks, num_splits)
    if pid_t * BLOCK_T >= gl.load(num_padded_ptr):
        return
    expert, rows, slot, row_ok = _tile_setup(sorted_ptr, block_expert_ptr, pid_t, num_slots, BLOCK_T,
                                             gl.SliceLayout(1, X_LAYOUT))
    kcol = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, X_LAYOUT))
    x_ptrs = act_ptr + rows[:, None].to(gl.int64) * stride_am + kcol[None, :]  # plan rows, sorted order
    w_ptrs, s_ptrs, w_mask, word = _weight_pointers(w_ptr, s_ptr, expert, pid_w, N, stride_we, stride_wn,
                                                    stride_se, stride_sn, WORD_LAYOUT)
    k_start = pid_s * k_per_split
    k_end = gl.minimum(K, k_start + k_per_split)
    acc, _ = _k_loop(w_ptrs, s_ptrs, 0, 0, x_ptrs, row_ok[:, None], w_mask, word, kcol, k_start, k_end,
                     BLOCK_T, False)

    acc = gl.convert_layout(acc, OUT_LAYOUT)
    orow, o_ok, prow = _out_rows(pid_w, pid_t, N, BLOCK_T)
    pslot = gl.load(sorted_ptr + prow)
    p_ok = pslot < num_slots
    bias = gl.load(b_ptr + expert * stride_be + orow, mask=o_ok & (pid_s == 0), other=0.0)  # first split only
    gate_w = gl.load(topk_w_ptr + pslot, mask=p_ok, other=0.0).to(gl.float32)
    out = (acc * UNSCALE + bias[:, None]) * gate_w[None, :]
    y_ptrs = y_ptr + pid_s.to(gl.int64) * stride_ys + pslot[None, :].to(gl.int64) * stride_ym + orow[:, None]
    gl.store(y_ptrs, out.to(y_ptr.dtype.element_ty), mask=o_ok[:, None] & p_ok[None, :])


def supported(device: torch.device, hidden: int, intermediate: int) -> bool:
    """The Gluon kernels need a Hopper GPU (warpgroup MMA) and K dimensions in whole 64-column steps."""
    return (device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)
            and hidden % 64 == 0 and intermediate % 64 == 0)


# Token tile by the most slots an expert gets on average (T * top_k / E), as in moe_swapped.py; the
# gate/up kernel spills registers with a 64-slot tile, so 32 serves every larger batch.
BLOCK_T_BY_SLOTS = {8: 16, 1 << 30: 32}


def fused_moe_gluon(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    prepared: PreparedExperts,
    swiglu_limit: float,
    block_t: int | None = None,
    min_programs: int | None = None,
) -> torch.Tensor:
    """x [T, H] bf16 -> [T, H]; same function as moe_reference, on experts prepared with
    fragments=True. Host-sync free, CUDA-graph capturable."""
    if x.shape[0] > MAX_TOKENS:  # moe_swapped's bound: larger batches run in chunks of that many tokens
        return torch.cat([fused_moe_gluon(x[i:i + MAX_TOKENS], topk_weights[i:i + MAX_TOKENS],
                                          topk_ids[i:i + MAX_TOKENS], prepared, swiglu_limit, block_t, min_programs)
                          for i in range(0, x.shape[0], MAX_TOKENS)])
    assert prepared.fragments, "experts were not prepared in the fragment layout"
    num_tokens, hidden = x.shape
    top_k = topk_ids.shape[1]
    num_slots = num_tokens * top_k
    inter = prepared.intermediate
    bt = block_t or by_slots(BLOCK_T_BY_SLOTS, num_tokens, prepared.num_experts, top_k)
    if min_programs is None:
        min_programs = PROGRAMS_PER_SM * torch.cuda.get_device_properties(x.device).multi_processor_count
    x = x.contiguous()
    topk_w = topk_weights.reshape(-1).contiguous()
    plan: RoutingPlan = align_tokens(topk_ids, prepared.num_experts, bt)
    rows = plan.sorted_slots.shape[0]
    act = torch.empty(rows, inter, dtype=x.dtype, device=x.device)
    w1, s1, b1 = prepared.w1, prepared.s1, prepared.b1
    w2, s2, b2 = prepared.w2, prepared.s2, prepared.b2
    tb = plan.max_blocks
    used_t_blocks = used_tiles(plan, num_slots, bt, prepared.num_experts)
    w_blocks1 = triton.cdiv(inter, BLOCK_W)
    splits1, per_split1 = split_k(used_t_blocks * w_blocks1, hidden, int(BLOCK_K), min_programs)
    part = torch.empty(splits1, rows, 2 * inter, dtype=torch.float32, device=x.device) if splits1 > 1 else act
    _gate_up_kernel[(tb * splits1 * w_blocks1,)](
        x, w1, s1, b1, act, part, plan.sorted_slots, plan.block_expert, plan.num_padded,
        num_slots, inter, hidden, tb, splits1, per_split1, float(swiglu_limit),
        x.stride(0), w1.stride(0), w1.stride(1), s1.stride(0), s1.stride(1), b1.stride(0), act.stride(0),
        part.stride(0), part.stride(1),
        TOP_K=top_k, BLOCK_T=bt, SPLIT=splits1 > 1, ALPHA=SWIGLU_ALPHA, UNSCALE=UNSCALE, num_warps=NUM_WARPS,
    )
    if splits1 > 1:
        _swiglu_splits_kernel[(tb, triton.cdiv(inter, SWIGLU_BLOCK_N))](
            part, b1, act, plan.sorted_slots, plan.block_expert, plan.num_padded,
            num_slots, inter, splits1, float(swiglu_limit), part.stride(0), part.stride(1), b1.stride(0),
            act.stride(0), BLOCK_T=bt, BLOCK_N=SWIGLU_BLOCK_N, ALPHA=SWIGLU_ALPHA,
        )
    w_blocks2 = triton.cdiv(hidden, BLOCK_W)
    splits2, per_split2 = split_k(used_t_blocks * w_blocks2, inter, int(BLOCK_K), min_programs)
    y = down_output(splits2, num_slots, hidden, x)
    _down_kernel[(tb * splits2 * w_blocks2,)](
        act, w2, s2, b2, y, topk_w, plan.sorted_slots, plan.block_expert, plan.num_padded,
        num_slots, hidden, inter, tb, splits2, per_split2,
        act.stride(0), w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1), b2.stride(0), y.stride(0),
        y.stride(1), BLOCK_T=bt, UNSCALE=UNSCALE, num_warps=NUM_WARPS,
    )
    return sum_experts(y, num_tokens, top_k, x.dtype)


def compile_kernels(prepared: PreparedExperts, top_k: int, swiglu_limit: float, dtype: torch.dtype) -> None:
    """moe_swapped.compile_kernels for this kernel and its token-tile buckets."""
    moe_swapped.compile_kernels(prepared, top_k, swiglu_limit, dtype, fused_moe_gluon, BLOCK_T_BY_SLOTS)
