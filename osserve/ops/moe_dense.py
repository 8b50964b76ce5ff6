"""MoE for prefill-size batches: per expert, dequantise its MXFP4 weights once (a one-pass
Triton kernel) and run cuBLAS on that expert's rows.

With thousands of rows per expert the matmuls are compute-bound, and cuBLAS's bf16 GEMMs beat
a 4-bit in-register kernel that must dequantise the same tile again for every block of rows.
Decode-size batches use the fused kernels (moe_gluon.py, moe_swapped.py) instead.

Around the GEMMs everything is one pass: the clamped SwiGLU reads the interleaved gate/up rows
once, and one kernel gathers each token's k expert rows, weights and sums them. (In PyTorch ops
these were ~13 launches per expert and a float32 scatter: 8 x 2048 tokens, 20b, H100, 170 of a
339 ms step, with the GEMMs at ~110; BENCHMARKS.md.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from osserve.ops.moe import SWIGLU_ALPHA, ExpertWeights


@triton.jit
def _e2m1(nibble):  # noqa: ANN001, ANN202 - Triton JIT
    """E2M1 code (0..15) → value: bit 3 the sign; magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6.
    With e = bits 1-2 and m = bit 0: e == 0 gives 0.5 * m, else (2 + m) * 2^e / 4."""
    code = nibble.to(tl.int32)
    e = (code >> 1) & 3
    m = code & 1
    mag = tl.where(e == 0, 0.5 * m.to(tl.float32), ((2 + m) << e).to(tl.float32) * 0.25)
    return tl.where((code & 8) != 0, -mag, mag)


@triton.jit
def _dequant_kernel(b_ptr, s_ptr, out_ptr, n_bytes, BLOCK: tl.constexpr):  # noqa: ANN001
    off = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = off < n_bytes
    b = tl.load(b_ptr + off, mask=mask, other=0)
    scale = tl.exp2(tl.load(s_ptr + off // 16, mask=mask, other=127).to(tl.float32) - 127.0)
    # byte i holds values 2i (low nibble) and 2i + 1: interleaved, they are one contiguous store
    pair = tl.reshape(tl.join(_e2m1(b & 0xF) * scale, _e2m1(b >> 4) * scale), [2 * BLOCK])
    out = tl.program_id(0) * 2 * BLOCK + tl.arange(0, 2 * BLOCK)
    tl.store(out_ptr + out, pair.to(out_ptr.dtype.element_ty), mask=out < 2 * n_bytes)


def dequantize_mxfp4_triton(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[..., G, 16] + [..., G] → [..., G*32] in `dtype`: ops/mxfp4.dequantize_mxfp4 in one pass."""
    *prefix, groups, nbytes = blocks.shape
    out = torch.empty(*prefix, groups * nbytes * 2, dtype=dtype, device=blocks.device)
    n = blocks.numel()
    _dequant_kernel[(triton.cdiv(n, 1024),)](blocks.contiguous(), scales.contiguous(), out, n, BLOCK=1024)
    return out


@triton.jit
def _swiglu_kernel(h_ptr, out_ptr, n_cols, limit, stride_h, stride_o,  # noqa: ANN001
                   ALPHA: tl.constexpr, BLOCK: tl.constexpr):
    """One row block of [N, 2I] gate/up (interleaved: even columns gate, odd up) -> [N, I]."""
    row = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    pair = tl.arange(0, 2 * BLOCK) + tl.program_id(1) * 2 * BLOCK
    h = tl.load(h_ptr + row * stride_h + pair, mask=pair < 2 * n_cols, other=0.0).to(tl.float32)
    gate, up = tl.split(tl.reshape(h, [BLOCK, 2]))
    gate = tl.minimum(gate, limit)
    up = tl.minimum(tl.maximum(up, -limit), limit)
    act = gate * tl.sigmoid(ALPHA * gate) * (up + 1.0)
    tl.store(out_ptr + row * stride_o + col, act.to(out_ptr.dtype.element_ty), mask=col < n_cols)


SWIGLU_BLOCK = 1024


def swiglu_into(gate_up: torch.Tensor, out: torch.Tensor, limit: float) -> None:
    """moe.swiglu(gate_up) written into out [N, I] (row stride free), in float32, rounded once."""
    rows, inter = out.shape
    if rows:
        _swiglu_kernel[(rows, triton.cdiv(inter, SWIGLU_BLOCK))](
            gate_up, out, inter, float(limit), gate_up.stride(0), out.stride(0), ALPHA=SWIGLU_ALPHA,
            BLOCK=SWIGLU_BLOCK)


@triton.jit
def _combine_kernel(ys_ptr, row_of_ptr, w_ptr, out_ptr, hidden, stride_y, stride_o,  # noqa: ANN001
                    TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    """out[t] = sum_j w[t, j] * ys[row_of[t * k + j]], in float32."""
    token = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = col < hidden
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        row = tl.load(row_of_ptr + token * TOP_K + j).to(tl.int64)
        weight = tl.load(w_ptr + token * TOP_K + j).to(tl.float32)
        acc += weight * tl.load(ys_ptr + row * stride_y + col, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + token * stride_o + col, acc.to(out_ptr.dtype.element_ty), mask=mask)


COMBINE_BLOCK = 1024


def moe_prefill_dense(
    x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, experts: ExpertWeights,
    swiglu_limit: float,
) -> torch.Tensor:
    """Large batches: per expert, dequantise its weights once and run cuBLAS on its rows.

    With thousands of rows per expert the matmuls are compute-bound, so the 4-bit in-register
    path's repeated dequantisation costs more than one bf16 copy of each expert (~50 MB, freed
    right after). Reads the expert counts on the host: never inside a CUDA graph."""
    assert experts.gate_up_blocks is not None and experts.gate_up_scales is not None
    assert experts.down_blocks is not None and experts.down_scales is not None
    t, k = topk_ids.shape
    hidden, inter = x.shape[1], experts.down_blocks.shape[2] * 32
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)  # slot (token * k + j) of each sorted row
    row_of = torch.empty_like(order)
    row_of[order] = torch.arange(order.numel(), device=x.device)
    counts = torch.bincount(flat, minlength=experts.num_experts).tolist()
    xs = x[order // k]
    b1, b2 = experts.gate_up_bias.to(x.dtype), experts.down_bias.to(x.dtype)
    act = torch.empty(t * k, inter, dtype=x.dtype, device=x.device)
    ys = torch.empty(t * k, hidden, dtype=x.dtype, device=x.device)
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        rows = slice(start, start + n)
        w1 = dequantize_mxfp4_triton(experts.gate_up_blocks[e], experts.gate_up_scales[e], x.dtype)
        swiglu_into(torch.addmm(b1[e], xs[rows], w1.t()), act[rows], swiglu_limit)
        del w1
        w2 = dequantize_mxfp4_triton(experts.down_blocks[e], experts.down_scales[e], x.dtype)
        torch.addmm(b2[e], act[rows], w2.t(), out=ys[rows])
        start += n
    out = torch.empty_like(x)
    if t:
        _combine_kernel[(t, triton.cdiv(hidden, COMBINE_BLOCK))](
            ys, row_of, topk_weights.reshape(-1).contiguous(), out, hidden, ys.stride(0), out.stride(0),
            TOP_K=k, BLOCK=COMBINE_BLOCK)
    return out
