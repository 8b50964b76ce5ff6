"""The add + RMSNorm that sums the MoE's unreduced rows (norm_triton, x [S, T, k, H]) against what it
replaced (moe_swapped.sum_experts, then add + RMSNorm), by warps per program, at gpt-oss-20b's H.

Run on the GPU: PYTHONPATH=$PWD python3 benchmarks/bench_norm_parts.py
Per-call µs of 24 calls in a row replayed as one CUDA graph (as a decode step meets them), each
call on its own rows, median of do_bench. Batch 1's rows are two float32 K splits of the down GEMM
(S=2) or one bf16 set unsplit (S=1); S=0 rows time the plain add + RMSNorm of a [T, H] x.
Correctness first: the residual matches the old path bit for bit. Prints the table last.
"""

from __future__ import annotations

from functools import partial

import torch

from benchmarks.bench_moe import graph_time_us
from osserve.ops.moe.swapped import sum_experts
from osserve.ops.norm.norm_triton import add_rms_norm_triton, default_warps

HIDDEN, TOP_K, EPS, LAYERS = 2880, 4, 1e-5, 24
CASES = ((1, 2), (1, 1), (4, 2), (32, 1), (1, 0), (32, 0))  # (tokens, splits); 0: a plain [T, H] x
WARPS = (4, 8, 16, 32)


def case(t: int, splits: int) -> tuple[float, list[float]]:
    """(sum_experts + add_rms_norm µs, the add_rms_norm of unreduced rows µs by WARPS)."""
    dtype = torch.float32 if splits > 1 else torch.bfloat16
    shape = (splits, t, TOP_K, HIDDEN) if splits else (t, HIDDEN)
    parts = [torch.randn(shape, device="cuda").to(dtype) for _ in range(LAYERS)]
    res = [torch.randn(t, HIDDEN, device="cuda").bfloat16() for _ in range(LAYERS)]
    w = torch.randn(HIDDEN, device="cuda").bfloat16()

    def before(i: int) -> object:
        if not splits:  # nothing to sum: the plain norm at its default warps
            return add_rms_norm_triton(parts[i], res[i], w, EPS)
        summed = sum_experts(parts[i].view(splits, t * TOP_K, HIDDEN), t, TOP_K, torch.bfloat16)
        return add_rms_norm_triton(summed, res[i], w, EPS)

    def after(i: int, warps: int | None = None) -> object:
        return add_rms_norm_triton(parts[i], res[i], w, EPS, num_warps=warps)

    old, new = before(0), after(0)
    assert isinstance(old, tuple) and isinstance(new, tuple)
    assert torch.equal(old[1], new[1]) and torch.equal(old[0], new[0]), (t, splits)
    return (graph_time_us([partial(before, i) for i in range(LAYERS)]),
            [graph_time_us([partial(after, i, nw) for i in range(LAYERS)]) for nw in WARPS])


def main() -> None:
    rows = [(t, splits, *case(t, splits), default_warps(HIDDEN, max(1, splits * TOP_K))) for t, splits in CASES]
    print(f"\n{torch.cuda.get_device_name()}: per-call us, 24 calls in one CUDA graph")
    print(f"{'T':>4} {'S':>3} {'sum+norm':>9} " + " ".join(f"{f'{nw} warps':>9}" for nw in WARPS) + "  default")
    for t, splits, before, by_warps, default in rows:
        print(f"{t:>4} {splits:>3} {before:>9.2f} " + " ".join(f"{u:>9.2f}" for u in by_warps) + f"  {default}")


if __name__ == "__main__":
    main()
