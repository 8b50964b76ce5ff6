"""What programmatic dependent launch (PDL) saves per kernel boundary in a CUDA graph (H100).

Run on the GPU: PYTHONPATH=$PWD python3 benchmarks/diag/pdl.py
A chain of N dependent launches of one small kernel (an RMSNorm-sized pass over [T, 2880] bf16,
each reading the previous one's output), captured in a CUDA graph, with and without PDL: with it,
each launch may start while its predecessor drains and waits (griddepcontrol.wait) before reading.
Correctness first (both chains give the same result as eager PyTorch), then µs per launch; a
table last.
"""

from __future__ import annotations

from functools import partial

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
from triton.testing import do_bench


@triton.jit
def _scale_add_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, PDL: tl.constexpr, EARLY: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if PDL:
        if EARLY:
            gdc_launch_dependents()
        gdc_wait()
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, (x * 0.5 + 1.0).to(y_ptr.dtype.element_ty), mask=offs < n)


def chain(x: torch.Tensor, bufs: list[torch.Tensor], launches: int, pdl: bool, early: bool, block: int) -> torch.Tensor:
    src = x
    for i in range(launches):
        dst = bufs[i % 2]
        _scale_add_kernel[(triton.cdiv(x.numel(), block),)](src, dst, x.numel(), BLOCK=block, PDL=pdl, EARLY=early,
                                                            launch_pdl=pdl)
        src = dst
    return src


def graph_us(fn, launches: int) -> float:
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return do_bench(graph.replay, warmup=25, rep=200, return_mode="median") * 1e3 / launches


def main() -> None:
    launches = 240
    rows = []
    for tokens in (1, 32, 256):
        x = torch.randn(tokens, 2880, device="cuda").bfloat16()
        bufs = [torch.empty_like(x) for _ in range(2)]
        ref = x.float()
        for _ in range(launches):
            ref = (ref * 0.5 + 1.0).bfloat16().float()
        for block in (1024, 4096):
            times = {}
            for name, pdl, early in (("plain", False, False), ("pdl", True, False), ("pdl+early", True, True)):
                out = chain(x, bufs, launches, pdl, early, block)
                torch.cuda.synchronize()
                assert torch.equal(out.float(), ref), name
                times[name] = graph_us(partial(chain, x, bufs, launches, pdl, early, block), launches)
            print(f"T={tokens} block {block}: " + ", ".join(f"{k} {v:.2f} us" for k, v in times.items()), flush=True)
            rows.append((tokens, block, times))
    print("\n    T  block  plain us/launch  pdl  pdl+early")
    for tokens, block, t in rows:
        print(f"{tokens:5d} {block:6d} {t['plain']:16.2f} {t['pdl']:5.2f} {t['pdl+early']:10.2f}")


if __name__ == "__main__":
    main()
