"""Router top-k + softmax over the chosen logits, in one small kernel over the [T, E] logits.

The logits GEMM stays on cuBLAS (F.linear with bias): at T=1 it is a [2880] x [2880, E] GEMV
that cuBLAS already runs near bandwidth, and it is the only part that reads much memory. What the
kernel replaces is torch.topk + torch.softmax (two launches, topk's being a generic sort).

Tie rule: among equal logits the lower expert index is chosen first (torch.topk on CUDA does not
promise an order for ties; on random data ties do not occur). NaN logits are not supported.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def _signed_order(bits):  # noqa: ANN001, ANN201
    """A float32's bits as an int32 that orders as the floats do (negatives: the other bits flipped).
    Its own inverse."""
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def topk_softmax_rows(vals, alive, rows, row_ok, cols, w_ptr, ids_ptr, K: tl.constexpr,
                      BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr):  # noqa: ANN001
    """Top-K of each row of vals [BLOCK_T, BLOCK_E] (fp32; `alive` marks real entries), softmax
    over those K, stored at rows of w_ptr / ids_ptr [T, K]; the ids [BLOCK_T, K] are also returned.
    Shared with the fused router GEMM.

    Each entry becomes one int64 key: its value's bits, made to order as a signed integer, above
    BLOCK_E - 1 - its column. So one max reduction a round finds the largest value and, among
    equal values, the lowest column, and the key found is struck out: K reductions, where a
    value's max and then its lowest column took 2K + 1 (at 120b the top-k, bias and softmax were
    ~44 µs of a batch-1 step: H100, 2026-11-25, benchmarks/history/2026-11-25-batch1-decode.md).
    Genuine -inf logits are still picked once each, above the padding."""
    vals = tl.where(vals == 0.0, 0.0, vals)  # -0.0 orders below +0.0 as bits; they are one value
    ordered = _signed_order(vals.to(tl.int32, bitcast=True))
    low = (BLOCK_E - 1 - cols).to(tl.int64)
    key = tl.where(alive, (ordered.to(tl.int64) << 32) | low[None, :], -(2**63))
    ks = tl.arange(0, K)[None, :]
    w = tl.zeros([BLOCK_T, K], dtype=tl.float32)
    ids = tl.zeros([BLOCK_T, K], dtype=tl.int64)
    top = tl.zeros([BLOCK_T], dtype=tl.float32)
    for i in tl.static_range(K):
        best = tl.max(key, axis=1)  # [BLOCK_T]
        key = tl.where(key == best[:, None], -(2**63), key)
        m = _signed_order((best >> 32).to(tl.int32)).to(tl.float32, bitcast=True)
        m = tl.where(best == -(2**63), float("-inf"), m)  # padding rows: nothing alive
        if i == 0:  # the row's max: the softmax shift (padding rows: 0, so that -inf - -inf is never taken)
            top = tl.where(m == float("-inf"), 0.0, m)
        # m <= top, so exp never overflows; round 0 gives exactly 1.
        w = tl.where(ks == i, tl.exp(m - top)[:, None], w)
        ids = tl.where(ks == i, (BLOCK_E - 1 - (best & 0xFFFFFFFF))[:, None], ids)
    denom = tl.sum(w, axis=1)
    w = w / tl.where(denom > 0, denom, 1.0)[:, None]  # 0 only on padding rows
    out = rows.to(tl.int64)[:, None] * K + ks
    tl.store(w_ptr + out, w.to(w_ptr.dtype.element_ty), mask=row_ok[:, None])
    tl.store(ids_ptr + out, ids, mask=row_ok[:, None])
    return ids


@triton.jit(do_not_specialize=["num_tokens"])  # per-step size: no recompile per divisibility class
def _topk_softmax_kernel(
    logits_ptr, w_ptr, ids_ptr, num_tokens, stride_t, E: tl.constexpr, K: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
):  # noqa: ANN001
    # One program: BLOCK_T rows of logits [BLOCK_T, BLOCK_E], all in registers (E <= a few hundred).
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_E)
    row_ok = rows < num_tokens
    alive = row_ok[:, None] & (cols[None, :] < E)
    vals = tl.load(logits_ptr + rows.to(tl.int64)[:, None] * stride_t + cols[None, :], mask=alive,
                   other=float("-inf")).to(tl.float32)
    topk_softmax_rows(vals, alive, rows, row_ok, cols, w_ptr, ids_ptr, K, BLOCK_T, BLOCK_E)


def topk_softmax_triton(logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [T, E] -> (softmax over the top-k logits [T, k] in logits' dtype, ids [T, k] int64).

    top_k must be a power of two (gpt-oss: 4) so the [T, k] tile needs no padding.
    """
    t, e = logits.shape
    assert logits.stride(1) == 1 and top_k <= e and top_k & (top_k - 1) == 0
    weights = torch.empty(t, top_k, dtype=logits.dtype, device=logits.device)
    ids = torch.empty(t, top_k, dtype=torch.int64, device=logits.device)
    if t:
        block_e = triton.next_power_of_2(e)
        block_t = max(1, min(16, 2048 // block_e, triton.next_power_of_2(t)))
        _topk_softmax_kernel[(triton.cdiv(t, block_t),)](
            logits, weights, ids, t, logits.stride(0), E=e, K=top_k, BLOCK_T=block_t, BLOCK_E=block_e,
            num_warps=1 if block_t * block_e <= 512 else 4,
        )
    return weights, ids


def route_triton(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, top_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, H], weight [E, H], bias [E] -> (weights [T, k], ids [T, k]) as `route_reference`."""
    return topk_softmax_triton(F.linear(x, weight, bias), top_k)
