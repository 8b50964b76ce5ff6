"""MoE for prefill-size batches: dequantise the layer's MXFP4 experts once (a one-pass Triton
kernel) and run two grouped GEMMs (torch._grouped_mm: CUTLASS on sm_90) over the rows sorted by
expert.

With thousands of rows per expert the matmuls are compute-bound, and bf16 GEMMs beat a 4-bit
in-register kernel that must dequantise the same tile again for every block of rows. Decode-size
batches and serving's mixed steps use the fused kernels (moe/gluon.py, moe/swapped.py) instead.

Around the GEMMs everything is one pass: the clamped SwiGLU reads the interleaved gate/up rows
once, adding each row's expert bias, and one kernel gathers each token's k expert rows, weights
and sums them. Nothing is read on the host: the expert boundaries reach the grouped GEMMs as a
device tensor. (Except where the grouped GEMM cannot run as one kernel: PyTorch runs it as a loop
after a host read on GPUs other than sm_90 / sm_100, and grouped_mm below loops itself for a float32
model on a GPU.) (Until 2026-11-27 this path looped over the experts on the host, a dequantisation
and a cuBLAS call each, after reading the counts: ~7 ms of a layer's call was the host's, whatever
the batch; benchmarks/diag/moe_dense_grouped.py.)
"""

from __future__ import annotations

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
def _swiglu_kernel(h_ptr, b_ptr, expert_ptr, out_ptr, n_cols, limit, stride_h, stride_b,  # noqa: ANN001
                   stride_o, ALPHA: tl.constexpr, BLOCK: tl.constexpr):
    """One row block of [N, 2I] gate/up (interleaved: even columns gate, odd up) + the bias row
    b[expert[n]] of the row's own expert -> [N, I]."""
    row = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    pair = tl.arange(0, 2 * BLOCK) + tl.program_id(1) * 2 * BLOCK
    pair_ok = pair < 2 * n_cols
    expert = tl.load(expert_ptr + row).to(tl.int64)
    h = tl.load(h_ptr + row * stride_h + pair, mask=pair_ok, other=0.0).to(tl.float32)
    h += tl.load(b_ptr + expert * stride_b + pair, mask=pair_ok, other=0.0).to(tl.float32)
    gate, up = tl.split(tl.reshape(h, [BLOCK, 2]))
    act = swiglu(gate, up, limit, ALPHA)
    tl.store(out_ptr + row * stride_o + col, act.to(out_ptr.dtype.element_ty), mask=col < n_cols)


SWIGLU_BLOCK = 1024


def swiglu_into(gate_up: torch.Tensor, bias: torch.Tensor, expert_of_row: torch.Tensor, out: torch.Tensor,
                limit: float) -> None:
    """moe.swiglu(gate_up + bias[expert_of_row]) written into out [N, I] (row stride free), in
    float32, rounded once. bias: [E, 2I]."""
    rows, inter = out.shape
    if rows:
        _swiglu_kernel[(rows, triton.cdiv(inter, SWIGLU_BLOCK))](
            gate_up, bias, expert_of_row, out, inter, float(limit), gate_up.stride(0), bias.stride(0),
            out.stride(0), ALPHA=SWIGLU_ALPHA, BLOCK=SWIGLU_BLOCK)


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


def combine_into(ys: torch.Tensor, row_of: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                 bias: torch.Tensor, out: torch.Tensor) -> None:
    """out [T, H] = each token's k expert rows of ys (row_of[t * k + j]) plus their down biases,
    weighted and summed in float32."""
    t, k = topk_ids.shape
    hidden = out.shape[1]
    if t:
        _combine_kernel[(t, triton.cdiv(hidden, COMBINE_BLOCK))](
            ys, row_of, topk_weights.reshape(-1).contiguous(), topk_ids.contiguous(), bias, out, hidden,
            ys.stride(0), bias.stride(0), out.stride(0), TOP_K=k, BLOCK=COMBINE_BLOCK)


def grouped_mm(rows: torch.Tensor, weights: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """rows [R, K] sorted by expert, weights [E, N, K], ends [E] (each expert's rows end there) ->
    [R, N]: each row times its expert's weights transposed. torch._grouped_mm where it takes the
    dtype (CUDA: bf16 only; the CPU: any), else a loop over the experts (a float32 model on a GPU)."""
    if rows.dtype == torch.bfloat16 or not rows.is_cuda:
        return torch._grouped_mm(rows, weights.transpose(1, 2), offs=ends)
    return expert_loop_mm(rows, weights, ends)


def expert_loop_mm(rows: torch.Tensor, weights: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """grouped_mm as one mm an expert, the boundaries read on the host."""
    out = rows.new_empty(rows.shape[0], weights.shape[1])
    start = 0
    for e, end in enumerate(ends.tolist()):
        if end > start:
            torch.mm(rows[start:end], weights[e].t(), out=out[start:end])
        start = end
    return out


def moe_prefill_dense(
    x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, experts: ExpertWeights,
    swiglu_limit: float,
) -> torch.Tensor:
    """Large batches: the layer's experts dequantised once, then one grouped GEMM a projection.

    The bf16 copies are the call's own, one projection at a time (the 20b's gate/up: 1.06 GB, its
    down 0.53 GB), each freed once its GEMM is launched."""
    assert experts.gate_up_blocks is not None and experts.gate_up_scales is not None
    assert experts.down_blocks is not None and experts.down_scales is not None
    t, k = topk_ids.shape
    inter = experts.down_blocks.shape[2] * 32
    out = torch.empty_like(x)
    if t == 0:
        return out
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)  # the slot (token * k + j) of each sorted row
    # Counts by scatter, not bincount: CUDA's bincount reads the largest id on the host.
    counts = torch.zeros(experts.num_experts, dtype=torch.int32, device=x.device)
    counts.scatter_add_(0, flat.long(), torch.ones_like(flat, dtype=torch.int32))
    ends = torch.cumsum(counts, 0, dtype=torch.int32)  # each expert's rows end here
    xs = x[order // k]
    w1 = dequantize_mxfp4_triton(experts.gate_up_blocks, experts.gate_up_scales, x.dtype)  # [E, 2I, H]
    gate_up = grouped_mm(xs, w1, ends)  # [T*k, 2I]
    del w1, xs
    act = torch.empty(t * k, inter, dtype=x.dtype, device=x.device)
    swiglu_into(gate_up, experts.gate_up_bias, flat[order], act, swiglu_limit)
    del gate_up
    w2 = dequantize_mxfp4_triton(experts.down_blocks, experts.down_scales, x.dtype)  # [E, H, I]
    ys = grouped_mm(act, w2, ends)  # [T*k, H]
    del w2, act
    row_of = torch.empty_like(order)
    row_of[order] = torch.arange(order.numel(), device=x.device, dtype=order.dtype)
    combine_into(ys, row_of, topk_weights, topk_ids, experts.down_bias, out)
    return out
