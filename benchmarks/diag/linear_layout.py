"""Why do the decode projections read at ~2.2 TB/s? The small-M linear (osserve/ops/linear/small_m_triton.py)
against variants that change only how the weight is read, at the o [2880, 4096] and fused q/k/v
[5120, 2880] shapes, one and eight tokens:
- `rows BN x BK`: the kernel as it is with other tiles (row pieces of 2 BK bytes);
- `tma`: the same row-major weight read by TMA (a tensor descriptor, box [BN, BK]);
- `tiled`: the weight stored tile-major ([N/BN, K/BK, BN, BK]: a program's K step is one contiguous
  2 BN BK bytes), plain loads;
- `stream`: a kernel that only reads the same bytes in contiguous chunks (the rate to aim at).

Run on the GPU: PYTHONPATH=$PWD python3 benchmarks/diag/linear_layout.py
Correctness first (each variant against F.linear in float32), then µs per layer from CUDA-graph
replays over LAYERS layers' distinct weights (bench_linear.graph_us), PDL off for every variant.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from benchmarks.bench_linear import LAYERS, graph_us, weights
from osserve.ops import pdl
from osserve.ops.linear.small_m_triton import LinearConfig, small_m_linear_triton

SHAPES = {"o": (2880, 4096), "qkv": (5120, 2880)}
TOKENS = (1, 8)


@triton.jit
def _variant_kernel(x_ptr, w, out_ptr, M, N, K, stride_xm, stride_os, k_per_split,
                    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                    NUM_STAGES: tl.constexpr, TMA: tl.constexpr):  # noqa: ANN001
    """float32 partials of x · wᵀ; w: a TensorDescriptor of the row-major weight (TMA), or the weight
    tile-major, [N/BN, K/BK, BN, BK] (K a multiple of BK there)."""
    pid = tl.program_id(0)
    split = tl.program_id(1)
    rm = tl.arange(0, BLOCK_M)
    m_ok = rm < M
    k_start = split * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    tile = w
    if not TMA:
        tile = w + pid.to(tl.int64) * BLOCK_N * K + (tl.arange(0, BLOCK_N) * BLOCK_K)[:, None] \
            + tl.arange(0, BLOCK_K)[None, :]
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k in tl.range(k_start, k_end, BLOCK_K, num_stages=NUM_STAGES):
        rk = k + tl.arange(0, BLOCK_K)
        if TMA:
            w_tile = w.load([pid * BLOCK_N, k])  # past K: zeros
        else:
            w_tile = tl.load(tile + k * BLOCK_N)
        x = tl.load(x_ptr + rm[None, :] * stride_xm + rk[:, None], mask=m_ok[None, :] & (rk < k_end)[:, None],
                    other=0.0)
        acc = tl.dot(w_tile, x, acc)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(out_ptr + split * stride_os + rm[None, :] * N + rn[:, None], acc, mask=(rn < N)[:, None] & m_ok[None, :])


@triton.jit
def _stream_kernel(w_ptr, out_ptr, CHUNK: tl.constexpr, BLOCK: tl.constexpr, NUM_STAGES: tl.constexpr):  # noqa: ANN001
    """Sums a contiguous CHUNK of int32 words per program: the weight's bytes and nothing else."""
    base = w_ptr + tl.program_id(0).to(tl.int64) * CHUNK
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for i in tl.range(0, CHUNK, BLOCK, num_stages=NUM_STAGES):
        acc ^= tl.load(base + i + tl.arange(0, BLOCK))
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc))


def tile_major(w: torch.Tensor, bn: int, bk: int) -> torch.Tensor:
    n, k = w.shape
    return w.reshape(n // bn, bn, k // bk, bk).permute(0, 2, 1, 3).contiguous()


def launch(kind: str, x: torch.Tensor, w: torch.Tensor, n: int, k: int, bn: int, bk: int, stages: int,
           splits: int) -> torch.Tensor:
    """float32 partials [splits, M, N] of x · wᵀ (w: the row-major weight, its TensorDescriptor, or tile-major)."""
    m = x.shape[0]
    k_per_split = triton.cdiv(triton.cdiv(k, splits), bk) * bk
    splits = triton.cdiv(k, k_per_split)
    out = torch.empty(splits, m, n, dtype=torch.float32, device=x.device)
    _variant_kernel[(triton.cdiv(n, bn), splits)](x, w, out, m, n, k, x.stride(0), out.stride(0), k_per_split,
                                                   BLOCK_N=bn, BLOCK_M=16, BLOCK_K=bk, NUM_STAGES=stages,
                                                   TMA=kind == "tma", num_warps=4)
    return out


def variants(n: int, k: int) -> list[tuple[str, str, int, int, int, int]]:
    """(label, kind, BN, BK, stages, splits)."""
    out = []
    for splits in (1, 2):
        out += [(f"rows 64x128 s5 /{splits}", "rows", 64, 128, 5, splits),
                (f"rows 32x256 s5 /{splits}", "rows", 32, 256, 5, splits),
                (f"rows 16x512 s6 /{splits}", "rows", 16, 512, 6, splits)]
        for bn, bk, st in ((64, 128, 5), (64, 128, 8), (128, 128, 4), (64, 256, 4)):
            out.append((f"tma {bn}x{bk} s{st} /{splits}", "tma", bn, bk, st, splits))
            if k % bk == 0 and n % bn == 0:
                out.append((f"tiled {bn}x{bk} s{st} /{splits}", "tiled", bn, bk, st, splits))
    return out


def run_variant(kind: str, x: torch.Tensor, ws: list, n: int, k: int, bn: int, bk: int, st: int,
                splits: int, i: int) -> torch.Tensor:
    if kind == "rows":
        return small_m_linear_triton(x, ws[i][0], None, LinearConfig(bn, bk, 4, st), splits=splits)
    return launch(kind, x, ws[i], n, k, bn, bk, st, splits)


def prepared(kind: str, ws: list[tuple[torch.Tensor, torch.Tensor]], bn: int, bk: int) -> list:
    if kind == "tma":
        return [TensorDescriptor.from_tensor(w, [bn, bk]) for w, _ in ws]
    if kind == "tiled":
        return [tile_major(w, bn, bk) for w, _ in ws]
    return ws


def main() -> None:
    pdl.ENABLED = False
    results = []
    for name, (n, k) in SHAPES.items():
        ws = weights(n, k, LAYERS)
        nbytes = n * k * 2
        for label, kind, bn, bk, st, splits in variants(n, k):
            prep = prepared(kind, ws, bn, bk)
            row = []
            for m in TOKENS:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                got = run_variant(kind, x, prep, n, k, bn, bk, st, splits, 0).float()
                got = got.sum(0).reshape(m, n) if got.dim() > 2 else got
                ref = F.linear(x.float(), ws[0][0].float())
                err = ((got - ref).norm() / ref.norm()).item()
                assert err < 1e-2, (name, label, m, err)
                row.append(graph_us(lambda i, x=x, kind=kind, prep=prep, n=n, k=k, bn=bn, bk=bk, st=st,
                                    splits=splits: run_variant(kind, x, prep, n, k, bn, bk, st, splits, i), LAYERS))
            results.append((name, label, row, nbytes))
        for chunk_kb in (64, 256):
            chunk = chunk_kb * 1024 // 4
            words = [w.view(torch.int32).reshape(-1) for w, _ in ws]
            sink = torch.empty(nbytes // 4 // chunk + 1, dtype=torch.int32, device="cuda")
            us = graph_us(lambda i, words=words, chunk=chunk, sink=sink: _stream_kernel[(words[i].numel() // chunk,)](
                words[i], sink, CHUNK=chunk, BLOCK=2048, NUM_STAGES=4, num_warps=8), LAYERS)
            results.append((name, f"stream {chunk_kb} KB chunks", [us] * len(TOKENS), nbytes))
    print("correctness: every variant within 1e-2 of F.linear in float32")
    print("\nµs per layer (CUDA graph of 24 layers, PDL off), TB/s of weight bytes")
    print("| shape | variant (BN x BK, stages, K splits) | " + " | ".join(f"T={m} µs" for m in TOKENS)
          + " | TB/s at T=1 |")
    print("|---|---|" + "---|" * (len(TOKENS) + 1))
    for name, label, row, nbytes in results:
        print(f"| {name} | {label} | " + " | ".join(f"{v:.2f}" for v in row) + f" | {nbytes / row[0] / 1e6:.2f} |")


if __name__ == "__main__":
    main()
