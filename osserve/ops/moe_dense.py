"""Fused MXFP4 mixture of experts in Triton: weights stay 4-bit in memory, dequantised in
registers inside the matrix kernels; bf16 activations on the GPU, fp32 accumulation.

    routing → align:  (token, k) pairs sorted by expert, on the device (no host sync, so the
                      decode step can be a CUDA graph): `order`, per-expert `counts`/`offsets`
    gate_up kernel:   grid (expert, N-block); loops over its expert's rows in BLOCK_M chunks,
                      gathers those token rows of x, multiplies by the dequantised weight tile,
                      adds the bias and applies the clamped SwiGLU → act [T*k, I] (sorted order)
    down kernel:      grid (expert, N-block); act rows × dequantised down weights + bias, times
                      the router weight → partial [T*k, H] fp32 at the pair's original slot
    reduce:           partial.view(T, k, H).sum(1) (a tiny pass; atomics would make the sum's
                      order, and so greedy outputs, depend on timing)

Each program reads its expert's weight tile once per BLOCK_M rows. The activations' dtype sets
the dots' (bf16 on the GPU). MXFP4 bytes hold two values: column 2i in the low nibble, 2i+1 in
the high one; so the kernels split x into its even and odd columns and do two half-width dots
instead of interleaving. Decode-size batches use the GEMV kernels below (no sorting, no tensor
cores: a row of activations per program), prefill-size ones `moe_prefill_dense`.
"""

from __future__ import annotations

from dataclasses import dataclass

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
def _dequant_tile(w_ptr, s_ptr, rows, row_mask, k0, K_BYTES: tl.constexpr, K_GROUPS: tl.constexpr,
                  BN: tl.constexpr, BK: tl.constexpr):  # noqa: ANN001, ANN202
    """Weight rows `rows` [BN], input columns k0..k0+BK → (even, odd) [BN, BK/2] fp32 tiles.
    Each byte's scale is gathered per byte (16 bytes share one; the repeats hit L1), which
    avoids reshaping register tiles."""
    byte_cols = k0 // 2 + tl.arange(0, BK // 2)
    b = tl.load(w_ptr + rows[:, None] * K_BYTES + byte_cols[None, :], mask=row_mask[:, None], other=0)
    s = tl.load(s_ptr + rows[:, None] * K_GROUPS + (byte_cols // 16)[None, :], mask=row_mask[:, None],
                other=127)
    scale = tl.exp2(s.to(tl.float32) - 127.0)  # [BN, BK/2]
    return _e2m1(b & 0xF) * scale, _e2m1(b >> 4) * scale


@triton.jit
def _gate_up_kernel(x_ptr, order_ptr, offsets_ptr, counts_ptr, w_ptr, s_ptr, b_ptr, act_ptr,
                    K: tl.constexpr, I: tl.constexpr, TOPK: tl.constexpr, limit, alpha,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):  # noqa: ANN001
    e = tl.program_id(0)
    nb = tl.program_id(1)
    count = tl.load(counts_ptr + e)
    start = tl.load(offsets_ptr + e)
    j = nb * BN + tl.arange(0, BN)  # output (gate, up) pair index
    j_mask = j < I
    gate_rows = e * 2 * I + 2 * j  # rows in [E * 2I] of the flattened weights
    up_rows = gate_rows + 1
    b_gate = tl.load(b_ptr + e * 2 * I + 2 * j, mask=j_mask, other=0.0).to(tl.float32)
    b_up = tl.load(b_ptr + e * 2 * I + 2 * j + 1, mask=j_mask, other=0.0).to(tl.float32)
    for m0 in range(0, count, BM):
        r = m0 + tl.arange(0, BM)
        r_mask = r < count
        pair = tl.load(order_ptr + start + r, mask=r_mask, other=0)  # index into the T*k pairs
        tok = pair // TOPK
        acc_g = tl.zeros((BM, BN), dtype=tl.float32)
        acc_u = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            even = k0 + 2 * tl.arange(0, BK // 2)
            xe = tl.load(x_ptr + tok[:, None] * K + even[None, :], mask=r_mask[:, None], other=0.0)
            xo = tl.load(x_ptr + tok[:, None] * K + even[None, :] + 1, mask=r_mask[:, None], other=0.0)
            g_lo, g_hi = _dequant_tile(w_ptr, s_ptr, gate_rows, j_mask, k0, K // 2, K // 32, BN, BK)
            u_lo, u_hi = _dequant_tile(w_ptr, s_ptr, up_rows, j_mask, k0, K // 2, K // 32, BN, BK)
            # Dots in the activations' dtype: bf16 on the GPU (tensor cores), fp32 in CPU tests.
            acc_g += tl.dot(xe, tl.trans(g_lo.to(xe.dtype))) + tl.dot(xo, tl.trans(g_hi.to(xe.dtype)))
            acc_u += tl.dot(xe, tl.trans(u_lo.to(xe.dtype))) + tl.dot(xo, tl.trans(u_hi.to(xe.dtype)))
        gate = tl.minimum(acc_g + b_gate[None, :], limit)
        up = tl.minimum(tl.maximum(acc_u + b_up[None, :], -limit), limit)
        out = gate * tl.sigmoid(gate * alpha) * (up + 1.0)
        dst = act_ptr + (start + r)[:, None] * I + j[None, :]
        tl.store(dst, out.to(act_ptr.dtype.element_ty), mask=r_mask[:, None] & j_mask[None, :])


@triton.jit
def _down_kernel(act_ptr, order_ptr, offsets_ptr, counts_ptr, weights_ptr, w_ptr, s_ptr, b_ptr, out_ptr,
                 K: tl.constexpr, N: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):  # noqa: ANN001
    e = tl.program_id(0)
    nb = tl.program_id(1)
    count = tl.load(counts_ptr + e)
    start = tl.load(offsets_ptr + e)
    n = nb * BN + tl.arange(0, BN)
    n_mask = n < N
    rows = e * N + n
    bias = tl.load(b_ptr + e * N + n, mask=n_mask, other=0.0).to(tl.float32)
    for m0 in range(0, count, BM):
        r = m0 + tl.arange(0, BM)
        r_mask = r < count
        pair = tl.load(order_ptr + start + r, mask=r_mask, other=0)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            even = k0 + 2 * tl.arange(0, BK // 2)
            a_rows = (start + r)[:, None] * K
            ae = tl.load(act_ptr + a_rows + even[None, :], mask=r_mask[:, None], other=0.0)
            ao = tl.load(act_ptr + a_rows + even[None, :] + 1, mask=r_mask[:, None], other=0.0)
            w_lo, w_hi = _dequant_tile(w_ptr, s_ptr, rows, n_mask, k0, K // 2, K // 32, BN, BK)
            acc += tl.dot(ae, tl.trans(w_lo.to(ae.dtype))) + tl.dot(ao, tl.trans(w_hi.to(ae.dtype)))
        rw = tl.load(weights_ptr + pair, mask=r_mask, other=0.0).to(tl.float32)
        out = (acc + bias[None, :]) * rw[:, None]
        tl.store(out_ptr + pair[:, None] * N + n[None, :], out, mask=r_mask[:, None] & n_mask[None, :])


@triton.jit
def _gemv_tile(w_ptr, s_ptr, rows, row_mask, xe, xo, c, c_mask, K_BYTES: tl.constexpr,
               K_GROUPS: tl.constexpr):  # noqa: ANN001, ANN202
    """sum over this chunk of dequant(W[rows, chunk]) * x[chunk] → [BN] fp32 (no tensor cores:
    one row of activations, so the work is bandwidth, and plain FMAs keep the layout simple)."""
    m = row_mask[:, None] & c_mask[None, :]
    b = tl.load(w_ptr + rows[:, None] * K_BYTES + c[None, :], mask=m, other=0)
    s = tl.load(s_ptr + rows[:, None] * K_GROUPS + (c // 16)[None, :], mask=m, other=127)
    scale = tl.exp2(s.to(tl.float32) - 127.0)
    return tl.sum((_e2m1(b & 0xF) * xe[None, :] + _e2m1(b >> 4) * xo[None, :]) * scale, axis=1)


@triton.jit
def _gemv_gate_up_kernel(x_ptr, ids_ptr, w_ptr, s_ptr, b_ptr, act_ptr, K: tl.constexpr, I: tl.constexpr,
                         TOPK: tl.constexpr, limit, alpha, BN: tl.constexpr, BK: tl.constexpr):  # noqa: ANN001
    pair = tl.program_id(0)
    e = tl.load(ids_ptr + pair)
    tok = pair // TOPK
    j = tl.program_id(1) * BN + tl.arange(0, BN)
    j_mask = j < I
    gate_rows = e * 2 * I + 2 * j
    acc_g = tl.zeros((BN,), dtype=tl.float32)
    acc_u = tl.zeros((BN,), dtype=tl.float32)
    for k0 in range(0, K, BK):
        c = k0 // 2 + tl.arange(0, BK // 2)  # byte columns: values 2c (low nibble) and 2c+1
        c_mask = c < K // 2
        xe = tl.load(x_ptr + tok * K + 2 * c, mask=c_mask, other=0.0).to(tl.float32)
        xo = tl.load(x_ptr + tok * K + 2 * c + 1, mask=c_mask, other=0.0).to(tl.float32)
        acc_g += _gemv_tile(w_ptr, s_ptr, gate_rows, j_mask, xe, xo, c, c_mask, K // 2, K // 32)
        acc_u += _gemv_tile(w_ptr, s_ptr, gate_rows + 1, j_mask, xe, xo, c, c_mask, K // 2, K // 32)
    gate = tl.minimum(acc_g + tl.load(b_ptr + gate_rows, mask=j_mask, other=0.0).to(tl.float32), limit)
    up = acc_u + tl.load(b_ptr + gate_rows + 1, mask=j_mask, other=0.0).to(tl.float32)
    up = tl.minimum(tl.maximum(up, -limit), limit)
    out = gate * tl.sigmoid(gate * alpha) * (up + 1.0)
    tl.store(act_ptr + pair * I + j, out.to(act_ptr.dtype.element_ty), mask=j_mask)


@triton.jit
def _gemv_down_kernel(act_ptr, ids_ptr, weights_ptr, w_ptr, s_ptr, b_ptr, out_ptr, K: tl.constexpr,
                      N: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):  # noqa: ANN001
    pair = tl.program_id(0)
    e = tl.load(ids_ptr + pair)
    n = tl.program_id(1) * BN + tl.arange(0, BN)
    n_mask = n < N
    rows = e * N + n
    acc = tl.zeros((BN,), dtype=tl.float32)
    for k0 in range(0, K, BK):
        c = k0 // 2 + tl.arange(0, BK // 2)
        c_mask = c < K // 2
        ae = tl.load(act_ptr + pair * K + 2 * c, mask=c_mask, other=0.0).to(tl.float32)
        ao = tl.load(act_ptr + pair * K + 2 * c + 1, mask=c_mask, other=0.0).to(tl.float32)
        acc += _gemv_tile(w_ptr, s_ptr, rows, n_mask, ae, ao, c, c_mask, K // 2, K // 32)
    acc += tl.load(b_ptr + rows, mask=n_mask, other=0.0).to(tl.float32)
    rw = tl.load(weights_ptr + pair).to(tl.float32)
    tl.store(out_ptr + pair * N + n, acc * rw, mask=n_mask)


def fused_moe_gemv(
    x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, experts: ExpertWeights,
    swiglu_limit: float, bn: int = 32, bk: int = 512,
) -> torch.Tensor:
    """Decode sizes: one program per (token, expert) pair and block of output rows, reading the
    4-bit weights straight through; no sorting at all."""
    assert experts.gate_up_blocks is not None and experts.gate_up_scales is not None
    assert experts.down_blocks is not None and experts.down_scales is not None
    t, h = x.shape
    topk = topk_ids.shape[1]
    i = experts.gate_up_blocks.shape[1] // 2
    ids = topk_ids.reshape(-1).contiguous()
    x = x.contiguous()
    act = torch.empty(t * topk, i, dtype=x.dtype, device=x.device)
    _gemv_gate_up_kernel[(t * topk, triton.cdiv(i, bn))](
        x, ids, experts.gate_up_blocks, experts.gate_up_scales, experts.gate_up_bias, act, h, i, topk,
        swiglu_limit, SWIGLU_ALPHA, BN=bn, BK=bk, num_warps=4)
    partial = torch.empty(t * topk, h, dtype=torch.float32, device=x.device)
    _gemv_down_kernel[(t * topk, triton.cdiv(h, bn))](
        act, ids, topk_weights.reshape(-1).contiguous(), experts.down_blocks, experts.down_scales,
        experts.down_bias, partial, i, h, BN=bn, BK=bk, num_warps=4)
    return partial.view(t, topk, h).sum(1).to(x.dtype)


@dataclass
class MoEConfig:
    bm: int
    bn: int
    bk: int
    num_warps: int
    num_stages: int


def pick_config(num_tokens: int) -> MoEConfig:
    """Decode sizes: few rows per expert, many small N-blocks for bandwidth; prefill: bigger tiles."""
    if num_tokens <= 64:
        return MoEConfig(bm=16, bn=32, bk=64, num_warps=4, num_stages=3)
    return MoEConfig(bm=64, bn=64, bk=64, num_warps=4, num_stages=3)


def align_by_expert(topk_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(order: pair indices sorted by expert, counts [E], offsets [E]) — all on the device."""
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True).to(torch.int32)
    # scatter_add, not bincount: bincount sizes its output from the data (a host sync), which
    # a CUDA graph cannot hold.
    counts = torch.zeros(num_experts, dtype=torch.int32, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    offsets = (torch.cumsum(counts, 0) - counts).to(torch.int32)
    return order, counts, offsets


def fused_moe_triton(
    x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, experts: ExpertWeights,
    swiglu_limit: float, config: MoEConfig | None = None,
) -> torch.Tensor:
    """x [T, H] → [T, H]; experts must hold MXFP4 blocks/scales."""
    assert experts.gate_up_blocks is not None and experts.gate_up_scales is not None
    assert experts.down_blocks is not None and experts.down_scales is not None
    t, h = x.shape
    topk = topk_ids.shape[1]
    e = experts.num_experts
    i = experts.gate_up_blocks.shape[1] // 2
    cfg = config or pick_config(t)
    if h % cfg.bk or i % cfg.bk:
        raise ValueError(f"hidden {h} and expert size {i} must be multiples of BLOCK_K {cfg.bk}")
    order, counts, offsets = align_by_expert(topk_ids, e)
    x = x.contiguous()
    act = torch.empty(t * topk, i, dtype=x.dtype, device=x.device)
    _gate_up_kernel[(e, triton.cdiv(i, cfg.bn))](
        x, order, offsets, counts, experts.gate_up_blocks, experts.gate_up_scales, experts.gate_up_bias, act,
        h, i, topk, swiglu_limit, SWIGLU_ALPHA,
        BM=cfg.bm, BN=cfg.bn, BK=cfg.bk, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    partial = torch.empty(t * topk, h, dtype=torch.float32, device=x.device)
    _down_kernel[(e, triton.cdiv(h, cfg.bn))](
        act, order, offsets, counts, topk_weights.reshape(-1).contiguous(), experts.down_blocks,
        experts.down_scales, experts.down_bias, partial, i, h,
        BM=cfg.bm, BN=cfg.bn, BK=cfg.bk, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return partial.view(t, topk, h).sum(1).to(x.dtype)


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
