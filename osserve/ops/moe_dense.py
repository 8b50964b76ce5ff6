"""MoE for prefill-size batches: per expert, dequantise its MXFP4 weights once (a one-pass
Triton kernel) and run cuBLAS on that expert's rows.

With thousands of rows per expert the matmuls are compute-bound, and cuBLAS's bf16 GEMMs beat
a 4-bit in-register kernel that must dequantise the same tile again for every block of rows.
Decode-size batches use the fused kernel in moe_triton.py instead.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from osserve.ops.moe import ExpertWeights


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
    s = tl.load(s_ptr + off // 16, mask=mask, other=127)
    scale = tl.exp2(s.to(tl.float32) - 127.0)
    tl.store(out_ptr + 2 * off, (_e2m1(b & 0xF) * scale).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out_ptr + 2 * off + 1, (_e2m1(b >> 4) * scale).to(out_ptr.dtype.element_ty), mask=mask)


def dequantize_mxfp4_triton(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[..., G, 16] + [..., G] → [..., G*32] in `dtype`: ops/mxfp4.dequantize_mxfp4 in one pass."""
    *prefix, groups, nbytes = blocks.shape
    out = torch.empty(*prefix, groups * nbytes * 2, dtype=dtype, device=blocks.device)
    n = blocks.numel()
    _dequant_kernel[(triton.cdiv(n, 1024),)](blocks.contiguous(), scales.contiguous(), out, n, BLOCK=1024)
    return out


def moe_prefill_dense(
    x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, experts: ExpertWeights,
    swiglu_limit: float,
) -> torch.Tensor:
    """Large batches: per expert, dequantise its weights once and run cuBLAS on its rows.

    With thousands of rows per expert the matmuls are compute-bound, so the 4-bit in-register
    path's repeated dequantisation costs more than one bf16 copy of each expert (~50 MB, freed
    right after). Reads the expert counts on the host: never inside a CUDA graph."""
    from osserve.ops.moe import swiglu

    assert experts.gate_up_blocks is not None and experts.gate_up_scales is not None
    assert experts.down_blocks is not None and experts.down_scales is not None
    t, k = topk_ids.shape
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=experts.num_experts).tolist()
    xs = x[order // k]
    ys = torch.empty_like(xs)
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        rows = slice(start, start + n)
        w1 = dequantize_mxfp4_triton(experts.gate_up_blocks[e], experts.gate_up_scales[e], x.dtype)
        h = torch.nn.functional.linear(xs[rows], w1, experts.gate_up_bias[e].to(x.dtype))
        del w1
        w2 = dequantize_mxfp4_triton(experts.down_blocks[e], experts.down_scales[e], x.dtype)
        ys[rows] = torch.nn.functional.linear(swiglu(h, swiglu_limit), w2, experts.down_bias[e].to(x.dtype))
        start += n
    weighted = ys.float() * topk_weights.reshape(-1)[order, None].float()
    out = torch.zeros(t * k, x.shape[1], dtype=torch.float32, device=x.device)
    out[order] = weighted
    return out.view(t, k, -1).sum(1).to(x.dtype)
