"""The epilogues of the Gluon MoE kernels (moe/gluon.py): what a program does with its [64 weight
rows, BLOCK_T token slots] float32 accumulator once the K loop is done.

- gate/up: the rows are paired (mxfp4_fragments.pair_eights), so a 64-row tile is 32 act columns'
  gate and up; bias, then the clamped SwiGLU into act (or, with K split, the float32 partial sums
  for swapped._swiglu_splits_kernel).
- down: bias and router weight applied, each plan row's result stored in its slot's row of y.

Each has an `_inputs` half (the loads besides the accumulator), so that a kernel can issue them
before its K loop where it has the registers (the copy-warp path) rather than after.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

# The [64 weight rows, BLOCK_T] epilogue tile with the rows fastest (coalesced stores of act / y rows).
OUT_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 1], [32, 1], [4, 1], [0, 1]))
OUT_LAYOUT_32 = gl.constexpr(gl.BlockedLayout([1, 1], [32, 1], [1, 4], [0, 1]))  # [32 act columns, BLOCK_T]


@gluon.jit
def _out_rows(out0, N, prow0, ROWS: gl.constexpr, BLOCK_T: gl.constexpr, layout: gl.constexpr):
    """The epilogue's output rows out0.. (ROWS of them), their mask, and the token tile's plan rows
    prow0.. (BLOCK_T of them)."""
    orow = out0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    prow = prow0 + gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, layout))
    return orow, orow < N, prow


@gluon.jit
def _split_pairs(acc, BLOCK_T: gl.constexpr):
    """[64, BT] accumulator of paired rows (mxfp4_fragments.pair_eights: per 16 rows, 8 gates then
    their 8 ups) -> gate, up [32, BT] in the 32-row output layout. Rows r and r + 8 of a warp's 16
    are one thread's registers, so the split itself moves no data."""
    t = gl.permute(gl.reshape(acc, [4, 2, 8, BLOCK_T]), [0, 2, 3, 1])  # [warp, g, token, half]
    gate, up = gl.split(t)
    gate = gl.convert_layout(gl.reshape(gate, [32, BLOCK_T]), OUT_LAYOUT_32)
    up = gl.convert_layout(gl.reshape(up, [32, BLOCK_T]), OUT_LAYOUT_32)
    return gate, up


@gluon.jit
def gate_up_epilogue_inputs(tile, expert, row0, N, b_ptr, sorted_ptr, num_slots, stride_be, BLOCK_T: gl.constexpr,
                            SPLIT: gl.constexpr):
    """What gate_up_epilogue reads besides the accumulator: tile `tile`'s 32 act columns and their mask,
    the token tile's plan rows (row0..) and which hold a slot, and (unsplit) the gate and up biases."""
    col, c_ok, prow = _out_rows(tile * 32, N, row0, 32, BLOCK_T, OUT_LAYOUT_32)
    p_ok = gl.load(sorted_ptr + prow) < num_slots
    b_ok = c_ok & (not SPLIT)
    bg = gl.load(b_ptr + expert * stride_be + col, mask=b_ok, other=0.0)
    bu = gl.load(b_ptr + expert * stride_be + N + col, mask=b_ok, other=0.0)
    return col, c_ok, prow, p_ok, bg, bu


@gluon.jit
def gate_up_epilogue(acc, inputs, pid_s, N, limit, act_ptr, part_ptr, stride_am, stride_ps, stride_pm,
                     BLOCK_T: gl.constexpr, SPLIT: gl.constexpr, ALPHA: gl.constexpr, UNSCALE: gl.constexpr):
    """The 32 act columns of a 64-row tile (inputs: gate_up_epilogue_inputs'): bias + clamped SwiGLU
    into act, or with split K the float32 partial sums (gate at column c, up at N + c) for
    _swiglu_splits_kernel."""
    col, c_ok, prow, p_ok, bg, bu = inputs
    gate, up = _split_pairs(acc * UNSCALE, BLOCK_T)
    if SPLIT:
        p_ptrs = part_ptr + pid_s.to(gl.int64) * stride_ps + prow[None, :].to(gl.int64) * stride_pm + col[:, None]
        p_mask = c_ok[:, None] & p_ok[None, :]
        gl.store(p_ptrs, gate, mask=p_mask)
        gl.store(p_ptrs + N, up, mask=p_mask)
    else:
        gate = gl.minimum(gate + bg[:, None], limit)
        up = gl.minimum(gl.maximum(up + bu[:, None], -limit), limit)
        h = gate * (1.0 / (1.0 + gl.exp(-ALPHA * gate))) * (up + 1.0)  # moe.py's clamped SwiGLU
        a_out = act_ptr + prow[None, :].to(gl.int64) * stride_am + col[:, None]
        gl.store(a_out, h.to(act_ptr.dtype.element_ty), mask=c_ok[:, None] & (prow >= 0)[None, :])


@gluon.jit
def down_epilogue_inputs(pid_w, pid_s, row0, expert, N, b_ptr, topk_w_ptr, sorted_ptr, num_slots, stride_be,
                         BLOCK_T: gl.constexpr):
    """The down epilogue's output rows, the token tile's plan rows (row0..) and each one's slot, the bias
    (first K split only) and each slot's router weight, in OUT_LAYOUT."""
    orow, o_ok, prow = _out_rows(pid_w * 64, N, row0, 64, BLOCK_T, OUT_LAYOUT)
    pslot = gl.load(sorted_ptr + prow)
    p_ok = pslot < num_slots
    bias = gl.load(b_ptr + expert * stride_be + orow, mask=o_ok & (pid_s == 0), other=0.0)
    gate_w = gl.load(topk_w_ptr + pslot, mask=p_ok, other=0.0).to(gl.float32)
    return orow, o_ok, prow, pslot, p_ok, bias, gate_w


@gluon.jit
def down_store(acc, inputs, pid_s, y_ptr, stride_ys, stride_ym, UNSCALE: gl.constexpr):
    """Bias and router weight applied, each plan row's result stored in its slot's row of y."""
    acc = gl.convert_layout(acc, OUT_LAYOUT)
    orow, o_ok, prow, pslot, p_ok, bias, gate_w = inputs
    out = (acc * UNSCALE + bias[:, None]) * gate_w[None, :]
    y_ptrs = y_ptr + pid_s.to(gl.int64) * stride_ys + pslot[None, :].to(gl.int64) * stride_ym + orow[:, None]
    gl.store(y_ptrs, out.to(y_ptr.dtype.element_ty), mask=o_ok[:, None] & p_ok[None, :])
