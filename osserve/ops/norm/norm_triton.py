"""RMSNorm and residual-add + RMSNorm in one pass each (one program per row of H <= ~16k).

Each program loads its row (BLOCK = next_power_of_2(H), masked), adds the residual, stores the
sum, reduces in fp32 and stores weight·x·rsqrt(mean(x²)+eps): one read of x and residual, one
write of the sum and the normed row, where the unfused sequence makes ~7 passes.

x may also come unreduced, as the MoE or a K-split projection leaves it (norm.py: [S, T, k, H],
summed over S and k): the program then adds its token's S·k rows first, which saves a launch and
a round trip of the summed rows through memory.

The first layer's norm also takes the embedding's gather (embed_rms_norm_triton): its program
loads its token's table row where the others load x.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from osserve.ops.pdl import pdl_enter, pdl_launch


@triton.jit
def add_parts(x_ptr, res_ptr, x_offs, res_offs, mask, stride_xs, stride_xj, PARTS_S: tl.constexpr,
              PARTS_J: tl.constexpr, dtype: tl.constexpr):  # noqa: ANN001, ANN201
    """x + residual at the offsets given (any shape), the new residual in dtype. An unreduced x is
    summed first: splits outer, experts inner, in float32, rounded once, as moe/swapped.py's sum_experts
    adds. Shared with the router that takes the post-attention norm (router/fused_triton.py)."""
    if PARTS_S * PARTS_J == 1:
        x = tl.load(x_ptr + x_offs, mask=mask, other=0.0).to(tl.float32)
    else:
        x = tl.zeros(x_offs.shape, dtype=tl.float32)
        for s in tl.static_range(PARTS_S):
            for j in tl.static_range(PARTS_J):
                x += tl.load(x_ptr + s * stride_xs + j * stride_xj + x_offs, mask=mask, other=0.0).to(tl.float32)
        x = x.to(dtype).to(tl.float32)
    # gpt-oss adds in the activations' dtype before normalising: round the sum the same way.
    return (x + tl.load(res_ptr + res_offs, mask=mask, other=0.0).to(tl.float32)).to(dtype)


@triton.jit
def row_rstd(x, H, eps):  # noqa: ANN001, ANN201
    """1 / RMS of a whole row x [BLOCK] (float32, zero past H), as the norm kernel computes it."""
    return tl.rsqrt(tl.sum(x * x, axis=0) / H + eps)


@triton.jit
def _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, H: tl.constexpr, eps,
                         stride_xs, stride_xt, stride_xj,
                         HAS_RES: tl.constexpr, PARTS_S: tl.constexpr, PARTS_J: tl.constexpr,
                         BLOCK: tl.constexpr, PDL: tl.constexpr):  # noqa: ANN001
    row = tl.program_id(0).to(tl.int64)  # int64 offsets: free here, and safe for any T·H
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)  # a weight: before the wait (ops/pdl.py)
    pdl_enter(PDL)
    if HAS_RES:
        x = add_parts(x_ptr, res_ptr, row * stride_xt + cols, row * H + cols, mask, stride_xs, stride_xj,
                      PARTS_S, PARTS_J, sum_ptr.dtype.element_ty)
        # Safe when sum_ptr is res_ptr (in place): this program read its row above, and no other
        # program touches it.
        tl.store(sum_ptr + row * H + cols, x, mask=mask)
        x = x.to(tl.float32)
    else:
        x = tl.load(x_ptr + row * stride_xt + cols, mask=mask, other=0.0).to(tl.float32)
    y = w * (x * row_rstd(x, H, eps))  # weight applied in fp32, one rounding at the end
    tl.store(out_ptr + row * H + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def add_rms_norm_triton(
    x: torch.Tensor,  # [T, H], or unreduced [S, T, k, H] (then residual is required)
    residual: torch.Tensor | None,  # [T, H] or None
    weight: torch.Tensor,  # [H]
    eps: float,
    inplace: bool = False,
    num_warps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual), x + residual); with residual None: (norm(x), x).

    inplace: the new residual x + residual is written into `residual` (which must be contiguous)
    and that same tensor is returned, saving an allocation; otherwise a fresh tensor.
    num_warps: the program's warps (default: default_warps).
    """
    if x.dim() == 4:
        assert residual is not None and x.stride(3) == 1, (x.shape, x.stride())
        parts_s, t, parts_j, h = x.shape
        dtype = residual.dtype
    else:
        x = x.contiguous()
        (t, h), parts_s, parts_j, dtype = x.shape, 1, 1, x.dtype
    out = torch.empty(t, h, dtype=dtype, device=x.device)
    if residual is None:
        summed = x
    elif inplace:
        assert residual.is_contiguous() and residual.shape == (t, h) and residual.dtype == dtype
        summed = residual
    else:
        residual = residual.contiguous()
        summed = torch.empty_like(out)
    strides = x.stride() if x.dim() == 4 else (0, x.stride(0), 0)
    pdl = pdl_launch(x.device)
    if t:
        _add_rms_norm_kernel[(t,)](x, residual if residual is not None else x, weight, out, summed,
                                   h, eps, strides[0], strides[1], strides[2],
                                   HAS_RES=residual is not None, PARTS_S=parts_s, PARTS_J=parts_j,
                                   BLOCK=triton.next_power_of_2(h), PDL=pdl,
                                   num_warps=num_warps or default_warps(h, parts_s * parts_j), launch_pdl=pdl)
    return out, summed


@triton.jit
def _embed_rms_norm_kernel(ids_ptr, prev_rows_ptr, sampled_ptr, table_ptr, w_ptr, out_ptr, h_ptr, stride_table,
                           H: tl.constexpr, eps, PENDING: tl.constexpr, BLOCK: tl.constexpr,
                           PDL: tl.constexpr):  # noqa: ANN001
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)  # a weight: before the wait (ops/pdl.py)
    pdl_enter(PDL)
    token = tl.load(ids_ptr + row)
    if PENDING:  # the id is still on the device: row prev of the last step's sampled ids
        prev = tl.load(prev_rows_ptr + row)
        if prev >= 0:
            token = tl.load(sampled_ptr + prev)
    h = tl.load(table_ptr + token.to(tl.int64) * stride_table + cols, mask=mask, other=0.0)
    tl.store(h_ptr + row * H + cols, h, mask=mask)
    x = h.to(tl.float32)
    y = w * (x * row_rstd(x, H, eps))
    tl.store(out_ptr + row * H + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def embed_rms_norm_triton(
    ids: torch.Tensor,  # [T] int
    table: torch.Tensor,  # [vocab, H], rows contiguous
    weight: torch.Tensor,  # [H]
    eps: float,
    prev_rows: torch.Tensor | None = None,  # [T] int64: -1, or the row of `sampled` holding the id
    sampled: torch.Tensor | None = None,  # [N] int64
) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(table[ids]), table[ids]) in one pass: the gather is the norm kernel's load. With
    prev_rows, a token whose id is still on the device reads it from `sampled` first (async
    scheduling's pending tokens, without a copy into ids before the step)."""
    t, h = ids.shape[0], table.shape[1]
    assert table.stride(1) == 1 and (prev_rows is None) == (sampled is None)
    rows = torch.empty(t, h, dtype=table.dtype, device=table.device)
    out = torch.empty_like(rows)
    pdl = pdl_launch(table.device)
    if t:
        _embed_rms_norm_kernel[(t,)](ids, prev_rows if prev_rows is not None else ids,
                                     sampled if sampled is not None else ids, table, weight, out, rows,
                                     table.stride(0), h, eps, PENDING=prev_rows is not None,
                                     BLOCK=triton.next_power_of_2(h), PDL=pdl, num_warps=default_warps(h, 1),
                                     launch_pdl=pdl)
    return out, rows


def default_warps(hidden: int, parts: int) -> int:
    """Warps per row program. One program's loads are the whole cost at decode, so more threads,
    each with fewer columns, finish sooner. H100, H 2880, bench_norm_parts.py, per call in a CUDA
    graph, warps 4 / 8 / 16 / 32: plain x at T=1 2.69 / 2.38 / 2.35 / 2.43 us; the MoE's two float32
    K splits x 4 experts 7.06 / 4.85 / 5.14 / 3.19 (sum_experts + the norm before: 5.09); one bf16
    set of 4 rows 5.34 / 4.69 / 2.95 / 2.63."""
    if parts > 1:
        return 32
    return 8 if hidden <= 8192 else 16
