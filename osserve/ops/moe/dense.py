"""MoE for prefill-size batches: per expert, dequantise its MXFP4 weights once (a one-pass
Triton kernel) and run cuBLAS on that expert's rows.

With thousands of rows per expert the matmuls are compute-bound, and cuBLAS's bf16 GEMMs beat
a 4-bit in-register kernel that must dequantise the same tile again for every block of rows.
Decode-size batches use the fused kernels (moe/gluon.py, moe/swapped.py) instead.

Around the GEMMs everything is one pass: the clamped SwiGLU reads the interleaved gate/up rows
once, and one kernel gathers each token's k expert rows, weights and sums them. (In PyTorch ops
these were ~13 launches per expert and a float32 scatter: 8 x 2048 tokens, 20b, H100, 170 of a
339 ms step, with the GEMMs at ~110; BENCHMARKS.md.)
"""

from __future__ import annotations

from itertools import accumulate

import torch
import triton
import triton.language as tl

from osserve.ops.moe.dequant_triton import swiglu
from osserve.ops.moe.weights import SWIGLU_ALPHA, ExpertWeights


@triton.jit
def _e2m1(nibble):  # noqa: ANN001, ANN202 - Triton JIT
    """E2M1 code (0..15, int32) → float32 value: bit 3 the sign; magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6.
    Codes e|m >= 2 are normal floats (1 + m/2) * 2^(e-1): exponent field e + 126, mantissa m, so
    (code << 22) + (126 << 23) is their bit pattern; codes 0 and 1 are 0.0 and 0.5 (0x3F000000)."""
    code = nibble & 7
    bits = tl.where(code >= 2, (code << 22) + (126 << 23), code * 0x3F000000) | ((nibble & 8) << 28)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _dequant_kernel(b_ptr, s_ptr, out_ptr, n_groups, GROUPS: tl.constexpr):  # noqa: ANN001
    """GROUPS 32-value groups per program: [GROUPS, 16] bytes (byte i = values 2i low nibble, 2i + 1
    high) and one scale each -> [GROUPS, 32] values, interleaved back into one contiguous store."""
    group = tl.program_id(0).to(tl.int64) * GROUPS + tl.arange(0, GROUPS)
    ok = group < n_groups
    byte = tl.arange(0, 16)
    b = tl.load(b_ptr + group[:, None] * 16 + byte[None, :], mask=ok[:, None], other=0).to(tl.int32)
    scale = tl.exp2(tl.load(s_ptr + group, mask=ok, other=127).to(tl.float32) - 127.0)[:, None]
    pair = tl.reshape(tl.join(_e2m1(b & 0xF) * scale, _e2m1(b >> 4) * scale), [GROUPS, 32])
    col = tl.arange(0, 32)
    tl.store(out_ptr + group[:, None] * 32 + col[None, :], pair.to(out_ptr.dtype.element_ty), mask=ok[:, None])


DEQUANT_GROUPS = 128  # 8 KB of bf16 out per program


def dequantize_mxfp4_triton(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[..., G, 16] + [..., G] → [..., G*32] in `dtype`: ops/mxfp4.dequantize_mxfp4 in one pass."""
    *prefix, groups, nbytes = blocks.shape
    out = torch.empty(*prefix, groups * nbytes * 2, dtype=dtype, device=blocks.device)
    n = scales.numel()
    _dequant_kernel[(triton.cdiv(n, DEQUANT_GROUPS),)](blocks.contiguous(), scales.contiguous(), out, n,
                                                       GROUPS=DEQUANT_GROUPS)
    return out


@triton.jit
def _swiglu_kernel(h_ptr, b_ptr, out_ptr, n_cols, limit, stride_h, stride_o,  # noqa: ANN001
                   ALPHA: tl.constexpr, BLOCK: tl.constexpr):
    """One row block of [N, 2I] gate/up (interleaved: even columns gate, odd up) + bias [2I] -> [N, I]."""
    row = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    pair = tl.arange(0, 2 * BLOCK) + tl.program_id(1) * 2 * BLOCK
    pair_ok = pair < 2 * n_cols
    h = tl.load(h_ptr + row * stride_h + pair, mask=pair_ok, other=0.0).to(tl.float32)
    h += tl.load(b_ptr + pair, mask=pair_ok, other=0.0).to(tl.float32)
    gate, up = tl.split(tl.reshape(h, [BLOCK, 2]))
    act = swiglu(gate, up, limit, ALPHA)
    tl.store(out_ptr + row * stride_o + col, act.to(out_ptr.dtype.element_ty), mask=col < n_cols)


SWIGLU_BLOCK = 1024


def swiglu_into(gate_up: torch.Tensor, bias: torch.Tensor, out: torch.Tensor, limit: float) -> None:
    """moe.swiglu(gate_up + bias) written into out [N, I] (row stride free), in float32, rounded once."""
    rows, inter = out.shape
    if rows:
        _swiglu_kernel[(rows, triton.cdiv(inter, SWIGLU_BLOCK))](
            gate_up, bias, out, inter, float(limit), gate_up.stride(0), out.stride(0), ALPHA=SWIGLU_ALPHA,
            BLOCK=SWIGLU_BLOCK)


@triton.jit
def _combine_kernel(ys_ptr, row_of_ptr, w_ptr, ids_ptr, b_ptr, out_ptr, hidden, stride_y, stride_b,  # noqa: ANN001
                    stride_o, TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    """out[t] = sum_j w[t, j] * (ys[row_of[t * k + j]] + b[ids[t, j]]), in float32."""
    token = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = col < hidden
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        row = tl.load(row_of_ptr + token * TOP_K + j).to(tl.int64)
        expert = tl.load(ids_ptr + token * TOP_K + j).to(tl.int64)
        weight = tl.load(w_ptr + token * TOP_K + j).to(tl.float32)
        y = tl.load(ys_ptr + row * stride_y + col, mask=mask, other=0.0).to(tl.float32)
        acc += weight * (y + tl.load(b_ptr + expert * stride_b + col, mask=mask, other=0.0).to(tl.float32))
    tl.store(out_ptr + token * stride_o + col, acc.to(out_ptr.dtype.element_ty), mask=mask)


COMBINE_BLOCK = 1024
ROW_ALIGN = 128  # rows per expert rounded up to this (cuBLAS sees few distinct shapes)


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
    counts = torch.bincount(flat, minlength=experts.num_experts).tolist()
    # Each expert's rows start on a ROW_ALIGN boundary (padding rows hold token 0 and are never
    # read back), so the GEMMs see a few row counts again and again instead of a new one per expert
    # and call: cuBLAS picks a kernel per shape on the host, and new shapes left the GPU waiting.
    padded = [-(-n // ROW_ALIGN) * ROW_ALIGN for n in counts]
    starts, padded_starts = list(accumulate(counts, initial=0)), list(accumulate(padded, initial=0))
    shift = torch.tensor([p - s for p, s in zip(padded_starts[:-1], starts[:-1], strict=True)], device=x.device)
    padded_row = torch.arange(order.numel(), device=x.device) + shift[flat[order]]  # of each sorted row
    row_of = torch.empty_like(order)
    row_of[order] = padded_row
    source = torch.zeros(sum(padded), dtype=order.dtype, device=x.device)
    source[padded_row] = order // k
    xs = x[source]
    act = torch.empty(xs.shape[0], inter, dtype=x.dtype, device=x.device)
    ys = torch.empty(xs.shape[0], hidden, dtype=x.dtype, device=x.device)
    for e, (start, n) in enumerate(zip(padded_starts[:-1], padded, strict=True)):  # biases: in SwiGLU and combine
        if n == 0:
            continue
        rows = slice(start, start + n)
        w1 = dequantize_mxfp4_triton(experts.gate_up_blocks[e], experts.gate_up_scales[e], x.dtype)
        swiglu_into(torch.mm(xs[rows], w1.t()), experts.gate_up_bias[e], act[rows], swiglu_limit)
        del w1
        w2 = dequantize_mxfp4_triton(experts.down_blocks[e], experts.down_scales[e], x.dtype)
        torch.mm(act[rows], w2.t(), out=ys[rows])
    out = torch.empty_like(x)
    if t:
        bias = experts.down_bias
        _combine_kernel[(t, triton.cdiv(hidden, COMBINE_BLOCK))](
            ys, row_of, topk_weights.reshape(-1).contiguous(), topk_ids.contiguous(), bias, out, hidden,
            ys.stride(0), bias.stride(0), out.stride(0), TOP_K=k, BLOCK=COMBINE_BLOCK)
    return out
