"""Fused MXFP4 MoE on Hopper in Gluon: 4-bit weights dequantised straight into MMA registers.

Same plan as swapped.py (W @ X^T: weights are the warpgroup MMA's left operand, BLOCK_T token
slots its N; routing plan from moe/plan.py; split K at small grids; same epilogues), but written
in Gluon, where the register layouts are ours to state. The K loop (moe/gluon_loop.py) copies each
step's weights, scales and activations into a shared-memory ring with cp.async and dequantises the
weights into exactly the MMA's operand registers (at batch 1-2, moe/gluon_ws.py's loop instead: a
copy warp fills the ring by TMA); their epilogues are moe/gluon_epilogues.py's. Here are the two
GEMM kernels and their launch:
- gate/up rows are paired (mxfp4_fragments.pair_eights), so each 64-row tile yields 32 finished
  SwiGLU columns: a program takes one tile (small batches: twice the programs) or two (one
  128-deep async MMA per tile per K step, the second tile's dequantisation overlapping the first's
  MMA);
- the down GEMM applies bias and router weight and writes each slot's row (or K split's partial);
  sum_experts (or the next add_rms_norm) adds a token's rows;
- ragged token tiles: an expert's last tile whose second half holds no slot runs at half its rows.
The launch's choices by batch (token tile, ring depth, tiles a program, ...) are moe/gluon_tiles.py's.
The Triton kernels leave the layouts to the compiler, which staged the weights through shared
memory and waited on each of 2-8 MMAs per K step (NOTES-moe.md).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from osserve.ops.moe import gluon_tiles as choices
from osserve.ops.moe import swapped
from osserve.ops.moe.gluon_epilogues import (
    down_epilogue_inputs,
    down_store,
    gate_up_epilogue,
    gate_up_epilogue_inputs,
)
from osserve.ops.moe.gluon_loop import BLOCK_K, WORD_LAYOUT, k_loop, weight_pointers
from osserve.ops.moe.gluon_ws import MAX_REGISTERS, descriptors, k_loop_ws
from osserve.ops.moe.plan import RoutingPlan, align_tokens
from osserve.ops.moe.swapped import (
    MAX_TOKENS,
    SWIGLU_BLOCK_N,
    _swiglu_splits_kernel,
    by_slots,
    down_output,
    expert_rows,
    split_k,
    used_tiles,
)
from osserve.ops.moe.weights import SWIGLU_ALPHA, UNSCALE, PreparedExperts
from osserve.ops.pdl import pdl_enter_gluon, pdl_launch
from osserve.ops.policy import kernel_policy

BLOCK_W = 64  # weight rows per program: one warpgroup MMA's M
NUM_WARPS = 4


# [BLOCK_T, 128] activation rows (the MMA's right operand before shared memory).
X_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0]))


@gluon.jit
def _tile_rows(sorted_ptr, row0, num_slots, ROWS: gl.constexpr, layout: gl.constexpr):
    """A token tile's plan rows row0.. (ROWS of them), their slots and which hold one."""
    rows = row0 + gl.arange(0, ROWS, layout=layout)
    slot = gl.load(sorted_ptr + rows)
    return rows, slot, slot < num_slots


@gluon.jit
def _second_half_empty(sorted_ptr, row0, num_slots, BLOCK_T: gl.constexpr):
    """Whether the token tile at plan row row0 holds no slot past its first half. A plan segment
    lists its expert's slots first and its padding after (moe/plan.py), so the row at the half
    tells."""
    return gl.load(sorted_ptr + row0 + BLOCK_T // 2) >= num_slots


@gluon.jit
def _program(num_t_blocks, num_splits):
    """(token tile, K split, weight tile) of this program: token tiles fastest, so that neighbours
    share a weight tile (L2 reuse)."""
    pid = gl.program_id(0)
    return pid % num_t_blocks, (pid // num_t_blocks) % num_splits, pid // (num_t_blocks * num_splits)


@gluon.jit
def _first_word_and_scale(expert, tile, stride_we, stride_wt, stride_se, stride_st):
    """Offsets of an expert's 64-row tile's first word and scale byte (tile-major, mxfp4/fragments.py)."""
    tile = tile.to(gl.int64)
    return (expert * stride_we + tile * stride_wt).to(gl.int32), (expert * stride_se + tile * stride_st).to(gl.int32)


_PER_STEP = ["num_slots", "num_t_blocks", "num_splits"]


@gluon.jit
def _gate_up_rows(x_ptr, w_ptr, s_ptr, b_ptr, act_ptr, part_ptr, sorted_ptr, expert, row0, pid_s, pid_w,
                  num_slots, N, K, k_per_split, limit, stride_xm, stride_we, stride_wt, stride_se, stride_st,
                  stride_be, stride_am, stride_ps, stride_pm, TOP_K: gl.constexpr, ROWS: gl.constexpr,
                  SPLIT: gl.constexpr, ALPHA: gl.constexpr, UNSCALE: gl.constexpr, STAGES: gl.constexpr,
                  TILES: gl.constexpr):
    """A gate/up program's work on ROWS plan rows from row0, by the cp.async K loop."""
    rows, slot, row_ok = _tile_rows(sorted_ptr, row0, num_slots, ROWS, gl.SliceLayout(1, X_LAYOUT))
    token = (slot // TOP_K).to(gl.int64)
    kcol = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, X_LAYOUT))
    x_ptrs = x_ptr + token[:, None] * stride_xm + kcol[None, :]  # [ROWS, BK]
    tile = pid_w * TILES
    w_ptrs, s_ptrs, w_mask, word = weight_pointers(w_ptr, s_ptr, expert, tile, 2 * N, stride_we, stride_wt,
                                                    stride_se, stride_st, WORD_LAYOUT)
    k_start = pid_s * k_per_split
    k_end = gl.minimum(K, k_start + k_per_split)
    acc_a, acc_b = k_loop(w_ptrs, s_ptrs, stride_wt, stride_st, x_ptrs, row_ok[:, None], w_mask, word,
                          kcol, k_start, k_end, K, ROWS, TILES == 2, STAGES, False)
    inputs_a = gate_up_epilogue_inputs(tile, expert, row0, N, b_ptr, sorted_ptr, num_slots, stride_be, ROWS, SPLIT)
    gate_up_epilogue(acc_a, inputs_a, pid_s, N, limit, act_ptr, part_ptr, stride_am, stride_ps, stride_pm, ROWS,
                     SPLIT, ALPHA, UNSCALE)
    if TILES == 2:
        inputs_b = gate_up_epilogue_inputs(tile + 1, expert, row0, N, b_ptr, sorted_ptr, num_slots, stride_be, ROWS,
                                           SPLIT)
        gate_up_epilogue(acc_b, inputs_b, pid_s, N, limit, act_ptr, part_ptr, stride_am, stride_ps, stride_pm, ROWS,
                         SPLIT, ALPHA, UNSCALE)


@gluon.jit(do_not_specialize=_PER_STEP)
def _gate_up_kernel(
    x_ptr, w_ptr, s_ptr, w_desc, t_desc, s_desc,  # x [T, K]; w, s tile-major (mxfp4_fragments); their TMA
    b_ptr, act_ptr, part_ptr,  # descriptors (WS only: moe_gluon_ws.descriptors); b [E, 2N]
    sorted_ptr, block_expert_ptr, num_padded_ptr,  # act [P, N]; part [S, P, 2N] float32 (split K only)
    num_slots, N, K, num_t_blocks, num_splits, k_per_split, limit,
    stride_xm, stride_we, stride_wt, stride_se, stride_st, stride_be, stride_am, stride_ps, stride_pm,
    TOP_K: gl.constexpr, BLOCK_T: gl.constexpr, SPLIT: gl.constexpr, ALPHA: gl.constexpr, UNSCALE: gl.constexpr,
    STAGES: gl.constexpr, TILES: gl.constexpr, PDL: gl.constexpr, WS: gl.constexpr, RAGGED: gl.constexpr,
):
    """w's rows are paired (mxfp4_fragments.pair_eights): a 64-row tile is 32 columns' gate and up.
    A program takes TILES (1 or 2) consecutive tiles: 2 shares each activation step between two
    MMAs, 1 makes twice the programs (batch 1: 360 instead of 180 for 132 SMs). WS: the K loop with
    a copy warp (moe/gluon_ws.py; one tile). RAGGED: a token tile whose second half holds no slot
    (an expert's last tile) runs as a tile of half the rows: half the MMA work and activation copies."""
    pdl_enter_gluon(PDL)
    pid_t, pid_s, pid_w = _program(num_t_blocks, num_splits)
    row0 = pid_t * BLOCK_T
    if row0 >= gl.load(num_padded_ptr):
        return
    expert = gl.load(block_expert_ptr + pid_t).to(gl.int64)
    if WS:
        # Few token columns: the epilogue's inputs are read now, not in a round trip after the K loop.
        tile = pid_w * TILES
        inputs_a = gate_up_epilogue_inputs(tile, expert, row0, N, b_ptr, sorted_ptr, num_slots, stride_be, BLOCK_T,
                                           SPLIT)
        word0, scale0 = _first_word_and_scale(expert, tile, stride_we, stride_wt, stride_se, stride_st)
        acc = k_loop_ws(w_desc, t_desc, s_desc, word0, scale0, x_ptr, stride_xm, sorted_ptr, pid_t, num_slots,
                        pid_s * k_per_split, gl.minimum(K, (pid_s + 1) * k_per_split), K, BLOCK_T, TOP_K, STAGES,
                        False)
        gate_up_epilogue(acc, inputs_a, pid_s, N, limit, act_ptr, part_ptr, stride_am, stride_ps, stride_pm, BLOCK_T,
                         SPLIT, ALPHA, UNSCALE)
    elif RAGGED and _second_half_empty(sorted_ptr, row0, num_slots, BLOCK_T):
        _gate_up_rows(x_ptr, w_ptr, s_ptr, b_ptr, act_ptr, part_ptr, sorted_ptr, expert, row0, pid_s, pid_w,
                      num_slots, N, K, k_per_split, limit, stride_xm, stride_we, stride_wt, stride_se, stride_st,
                      stride_be, stride_am, stride_ps, stride_pm, TOP_K, BLOCK_T // 2, SPLIT, ALPHA, UNSCALE, STAGES,
                      TILES)
    else:
        _gate_up_rows(x_ptr, w_ptr, s_ptr, b_ptr, act_ptr, part_ptr, sorted_ptr, expert, row0, pid_s, pid_w,
                      num_slots, N, K, k_per_split, limit, stride_xm, stride_we, stride_wt, stride_se, stride_st,
                      stride_be, stride_am, stride_ps, stride_pm, TOP_K, BLOCK_T, SPLIT, ALPHA, UNSCALE, STAGES,
                      TILES)


@gluon.jit
def _down_rows(act_ptr, w_ptr, s_ptr, b_ptr, y_ptr, topk_w_ptr, sorted_ptr, expert, row0, pid_s, pid_w,
               num_slots, N, K, k_per_split, stride_am, stride_we, stride_wt, stride_se, stride_st, stride_be,
               stride_ys, stride_ym, ROWS: gl.constexpr, UNSCALE: gl.constexpr, STAGES: gl.constexpr,
               PDL: gl.constexpr, TILES: gl.constexpr):
    """A down program's work on ROWS plan rows from row0, by the cp.async K loop: TILES (1 or 2)
    consecutive 64-row weight tiles. Where N's tiles are odd in number, the last program's second tile
    repeats its first, and its rows (past N) are not stored."""
    rows, slot, row_ok = _tile_rows(sorted_ptr, row0, num_slots, ROWS, gl.SliceLayout(1, X_LAYOUT))
    kcol = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, X_LAYOUT))
    x_ptrs = act_ptr + rows[:, None].to(gl.int64) * stride_am + kcol[None, :]  # plan rows, sorted order
    tile = pid_w * TILES
    w_ptrs, s_ptrs, w_mask, word = weight_pointers(w_ptr, s_ptr, expert, tile, N, stride_we, stride_wt,
                                                    stride_se, stride_st, WORD_LAYOUT)
    second = (tile + 1) * 64 < N
    k_start = pid_s * k_per_split
    k_end = gl.minimum(K, k_start + k_per_split)
    acc_a, acc_b = k_loop(w_ptrs, s_ptrs, gl.where(second, stride_wt, 0), gl.where(second, stride_st, 0), x_ptrs,
                          row_ok[:, None], w_mask, word, kcol, k_start, k_end, K, ROWS, TILES == 2, STAGES, PDL)
    inputs_a = down_epilogue_inputs(tile, pid_s, row0, expert, N, b_ptr, topk_w_ptr, sorted_ptr, num_slots,
                                    stride_be, ROWS)
    down_store(acc_a, inputs_a, pid_s, y_ptr, stride_ys, stride_ym, UNSCALE)
    if TILES == 2:
        inputs_b = down_epilogue_inputs(tile + 1, pid_s, row0, expert, N, b_ptr, topk_w_ptr, sorted_ptr, num_slots,
                                        stride_be, ROWS)
        down_store(acc_b, inputs_b, pid_s, y_ptr, stride_ys, stride_ym, UNSCALE)


@gluon.jit(do_not_specialize=_PER_STEP)
def _down_kernel(
    act_ptr, w_ptr, s_ptr, w_desc, t_desc, s_desc,  # act [P, K]; w, s tile-major, their descriptors (WS)
    b_ptr, y_ptr, topk_w_ptr,  # y [S, T*k, N]
    sorted_ptr, block_expert_ptr, num_padded_ptr,
    num_slots, N, K, num_t_blocks, num_splits, k_per_split,
    stride_am, stride_we, stride_wt, stride_se, stride_st, stride_be, stride_ys, stride_ym,
    BLOCK_T: gl.constexpr, UNSCALE: gl.constexpr, STAGES: gl.constexpr, PDL: gl.constexpr, WS: gl.constexpr,
    RAGGED: gl.constexpr, TILES: gl.constexpr,
):
    """With PDL the wait for the gate/up kernel is in the K loop, after its first weight copies. The
    routing plan read before it comes from the kernel before gate/up (the router or the plan's own
    launch), which gate/up waited for before it let this kernel launch (ops/pdl.py). RAGGED: as
    _gate_up_kernel's (the same tiles run at half their rows in both). TILES: 64-row weight tiles a
    program (1 or 2; the copy-warp loop takes 1), as _gate_up_kernel's."""
    pid_t, pid_s, pid_w = _program(num_t_blocks, num_splits)
    row0 = pid_t * BLOCK_T
    if row0 >= gl.load(num_padded_ptr):
        return
    expert = gl.load(block_expert_ptr + pid_t).to(gl.int64)
    if WS:
        # Few token columns: the epilogue's inputs are read now, not on the K loop's far side (two
        # dependent round trips there: the slots, then their router weights).
        inputs = down_epilogue_inputs(pid_w, pid_s, row0, expert, N, b_ptr, topk_w_ptr, sorted_ptr, num_slots,
                                      stride_be, BLOCK_T)
        word0, scale0 = _first_word_and_scale(expert, pid_w, stride_we, stride_wt, stride_se, stride_st)
        acc = k_loop_ws(w_desc, t_desc, s_desc, word0, scale0, act_ptr, stride_am, sorted_ptr, pid_t, num_slots,
                        pid_s * k_per_split, gl.minimum(K, (pid_s + 1) * k_per_split), K, BLOCK_T, 0, STAGES, PDL)
        down_store(acc, inputs, pid_s, y_ptr, stride_ys, stride_ym, UNSCALE)
    elif RAGGED and _second_half_empty(sorted_ptr, row0, num_slots, BLOCK_T):
        _down_rows(act_ptr, w_ptr, s_ptr, b_ptr, y_ptr, topk_w_ptr, sorted_ptr, expert, row0, pid_s, pid_w,
                   num_slots, N, K, k_per_split, stride_am, stride_we, stride_wt, stride_se, stride_st, stride_be,
                   stride_ys, stride_ym, BLOCK_T // 2, UNSCALE, STAGES, PDL, TILES)
    else:
        _down_rows(act_ptr, w_ptr, s_ptr, b_ptr, y_ptr, topk_w_ptr, sorted_ptr, expert, row0, pid_s, pid_w,
                   num_slots, N, K, k_per_split, stride_am, stride_we, stride_wt, stride_se, stride_st, stride_be,
                   stride_ys, stride_ym, BLOCK_T, UNSCALE, STAGES, PDL, TILES)


def supported(device: torch.device, hidden: int, intermediate: int) -> bool:
    """The Gluon kernels need the Hopper kernel policy (ops/policy.py: sm_90, warpgroup MMA, not forced
    portable) and K dimensions in whole 64-column steps."""
    return device.type == "cuda" and kernel_policy(device).hopper and hidden % 64 == 0 and intermediate % 64 == 0


def fused_moe_gluon(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    prepared: PreparedExperts,
    swiglu_limit: float,
    block_t: int | None = None,
    min_programs: int | None = None,
    stages: int | None = None,
    down_min_programs: int | None = None,
    gate_up_tiles: int | None = None,
    reduce: bool = True,
    plan: RoutingPlan | None = None,
    ws: bool | None = None,
    ragged: bool | None = None,
    max_registers: tuple[int | None, int | None] | None = None,
    down_tiles: int | None = None,
) -> torch.Tensor:
    """x [T, H] bf16 -> [T, H] (or unreduced: swapped.expert_rows); same function as
    moe_reference, on experts prepared with fragments=True. Host-sync free, CUDA-graph capturable.
    The defaults are moe/gluon_tiles.py's tables. K is split until a GEMM has min_programs (gate/up)
    or down_min_programs (down) programs; defaults: PROGRAMS_PER_SM and DOWN_PROGRAMS_PER_SM per SM.
    gate_up_tiles: 64-row tiles per gate/up program (1 or 2; default by token tile,
    GATE_UP_TILES_BY_BLOCK_T). plan: topk_ids' routing plan for this batch's token tile, if the router
    built it (else one is built here). ws: the K loops with a copy warp (moe/gluon_ws.py; default:
    WS_BLOCK_T tiles at small grids). ragged: an expert's last token tile runs at half its rows where
    its second half holds no slot (default: the RAGGED_BLOCK_T tiles). max_registers: the (gate/up,
    down) register caps of the cp.async kernels (default: MAX_REGISTERS_BY_BLOCK_T). down_tiles: 64-row
    down tiles a program (1 or 2; default by token tile, DOWN_TILES_BY_BLOCK_T; 1 with the copy warp)."""
    if x.shape[0] > MAX_TOKENS:  # swapped.py's bound: larger batches run in chunks of that many tokens
        return torch.cat([fused_moe_gluon(x[i:i + MAX_TOKENS], topk_weights[i:i + MAX_TOKENS],
                                          topk_ids[i:i + MAX_TOKENS], prepared, swiglu_limit, block_t, min_programs,
                                          stages, down_min_programs, gate_up_tiles, ws=ws, ragged=ragged,
                                          max_registers=max_registers, down_tiles=down_tiles)
                          for i in range(0, x.shape[0], MAX_TOKENS)])
    assert prepared.fragments, "experts were not prepared in the fragment layout"
    num_tokens, hidden = x.shape
    top_k = topk_ids.shape[1]
    num_slots = num_tokens * top_k
    inter = prepared.intermediate
    bt = block_t or by_slots(choices.BLOCK_T_BY_SLOTS, num_tokens, prepared.num_experts, top_k)
    stages = choices.STAGES_BY_BLOCK_T[bt] if stages is None else stages
    assert stages >= 2, "the ring needs a slot in use and one being filled"
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    min_programs = choices.PROGRAMS_PER_SM * sms if min_programs is None else min_programs
    down_min_programs = choices.DOWN_PROGRAMS_PER_SM * sms if down_min_programs is None else down_min_programs
    x = x.contiguous()
    topk_w = topk_weights.reshape(-1).contiguous()
    if plan is None or plan.block_m != bt:  # none from the router (router.route_with_plan), or another tile's
        plan = align_tokens(topk_ids, prepared.num_experts, bt)
    rows = plan.sorted_slots.shape[0]
    act = torch.empty(rows, inter, dtype=x.dtype, device=x.device)
    w1, s1, b1 = prepared.w1, prepared.s1, prepared.b1
    w2, s2, b2 = prepared.w2, prepared.s2, prepared.b2
    tb = plan.max_blocks
    used_t_blocks = used_tiles(plan, num_slots, bt, prepared.num_experts)
    gate_up_tiles = choices.GATE_UP_TILES_BY_BLOCK_T[bt] if gate_up_tiles is None else gate_up_tiles
    w_blocks1 = triton.cdiv(2 * inter, gate_up_tiles * BLOCK_W)
    splits1, per_split1 = split_k(used_t_blocks * w_blocks1, hidden, int(BLOCK_K), min_programs)
    part = torch.empty(splits1, rows, 2 * inter, dtype=torch.float32, device=x.device) if splits1 > 1 else act
    if ws is None:
        ws = (choices.COPY_WARP and bt in choices.WS_BLOCK_T
              and used_t_blocks * w_blocks1 <= choices.WS_PROGRAMS_PER_SM * sms)
    ws_up = ws and gate_up_tiles == 1
    ragged = (bt in choices.RAGGED_BLOCK_T if ragged is None else ragged) and not ws and bt >= 16
    caps = choices.MAX_REGISTERS_BY_BLOCK_T.get(bt, (None, None)) if max_registers is None else max_registers
    cap_up, cap_down = caps
    d1 = d2 = (None, None, None)
    if ws:
        if not prepared.descriptors:
            prepared.descriptors = (*descriptors(w1, s1), *descriptors(w2, s2))
        d2 = prepared.descriptors[3:]
        d1 = prepared.descriptors[:3] if ws_up else d1
    pdl = pdl_launch(x.device)
    _gate_up_kernel[(tb * splits1 * w_blocks1,)](
        x, w1, s1, *d1, b1, act, part, plan.sorted_slots, plan.block_expert, plan.num_padded,
        num_slots, inter, hidden, tb, splits1, per_split1, float(swiglu_limit),
        x.stride(0), w1.stride(0), w1.stride(1), s1.stride(0), s1.stride(1), b1.stride(0), act.stride(0),
        part.stride(0), part.stride(1),
        TOP_K=top_k, BLOCK_T=bt, SPLIT=splits1 > 1, ALPHA=SWIGLU_ALPHA, UNSCALE=UNSCALE, STAGES=stages,
        TILES=gate_up_tiles, PDL=pdl, WS=ws_up, RAGGED=ragged, num_warps=NUM_WARPS, launch_pdl=pdl,
        maxnreg=MAX_REGISTERS if ws_up else cap_up,
    )
    if splits1 > 1:
        _swiglu_splits_kernel[(tb, triton.cdiv(inter, SWIGLU_BLOCK_N))](
            part, b1, act, plan.sorted_slots, plan.block_expert, plan.num_padded,
            num_slots, inter, splits1, float(swiglu_limit), part.stride(0), part.stride(1), b1.stride(0),
            act.stride(0), BLOCK_T=bt, BLOCK_N=SWIGLU_BLOCK_N, ALPHA=SWIGLU_ALPHA,
        )
    down_tiles = (choices.DOWN_TILES_BY_BLOCK_T.get(bt, 1) if down_tiles is None else down_tiles) if not ws else 1
    if down_tiles == 2 and max_registers is None:
        cap_down = None  # the caps are the one-tile kernels' (the 64-token down's spills at two)
    w_blocks2 = triton.cdiv(triton.cdiv(hidden, BLOCK_W), down_tiles)
    splits2, per_split2 = split_k(used_t_blocks * w_blocks2, inter, int(BLOCK_K), down_min_programs)
    y = down_output(splits2, num_slots, hidden, x)
    _down_kernel[(tb * splits2 * w_blocks2,)](
        act, w2, s2, *d2, b2, y, topk_w, plan.sorted_slots, plan.block_expert, plan.num_padded,
        num_slots, hidden, inter, tb, splits2, per_split2,
        act.stride(0), w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1), b2.stride(0), y.stride(0),
        y.stride(1), BLOCK_T=bt, UNSCALE=UNSCALE, STAGES=stages, PDL=pdl, WS=ws, RAGGED=ragged, TILES=down_tiles,
        num_warps=NUM_WARPS, launch_pdl=pdl,
        maxnreg=MAX_REGISTERS if ws else cap_down,
    )
    return expert_rows(y, num_tokens, top_k, x.dtype, reduce)


def compile_kernels(prepared: PreparedExperts, top_k: int, swiglu_limit: float, dtype: torch.dtype) -> None:
    """swapped.compile_kernels for this kernel and its token-tile buckets."""
    swapped.compile_kernels(prepared, top_k, swiglu_limit, dtype, fused_moe_gluon, choices.BLOCK_T_BY_SLOTS)
