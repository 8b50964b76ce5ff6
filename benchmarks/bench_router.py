"""Small-batch router: cuBLAS logits + the top-k kernel (two launches, today's path above 128
tokens) vs the fused one-launch kernel (logits + top-k + softmax), gpt-oss shapes (H 2880,
E 32 and 128, top-4, bf16), T 1..128.

Run on the GPU: source benchmarks/gpu_env.sh; python benchmarks/bench_router.py
Checks correctness first (ids equal on tie-free rows, weights close, vs route_reference in fp32),
then times eager do_bench medians (µs, launch overhead included) and, for the same calls, one
CUDA graph of 20 calls (per-call µs: closer to what a captured decode step pays). The H-split
sweep shows what `default_split` picked against its neighbours. Prints the tables last.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

from osserve.ops.router.counters import router_counters
from osserve.ops.router.fused_triton import BLOCK_T, default_split, router_gemm_topk_triton
from osserve.ops.router.reference import route_reference
from osserve.ops.router.topk_triton import topk_softmax_triton

HIDDEN, TOP_K = 2880, 4
TOKENS = (1, 4, 16, 32, 64, 128)
EXPERTS = (32, 128)
SPLITS = (1, 4, 8, 16, 32, 45)
GRAPH_CALLS = 20


def us(fn: Callable[[], object]) -> float:
    return do_bench(fn, warmup=10, rep=40, return_mode="median") * 1e3


def graph_us(fn: Callable[[], object]) -> float:
    """Per-call time of fn replayed GRAPH_CALLS times inside one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # compile / warm up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_CALLS):
            fn()
    return do_bench(graph.replay, warmup=10, rep=40, return_mode="median") * 1e3 / GRAPH_CALLS


def inputs(t: int, e: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(t * e)
    x = torch.randn(t, HIDDEN, device="cuda", generator=g).bfloat16()
    w = (torch.randn(e, HIDDEN, device="cuda", generator=g) / HIDDEN**0.5).bfloat16()
    b = torch.randn(e, device="cuda", generator=g).bfloat16()
    return x, w, b


def old_path(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return topk_softmax_triton(F.linear(x, w, b), TOP_K)


def check(t: int, e: int) -> None:
    x, w, b = inputs(t, e)
    counters = router_counters("cuda")
    ref_w, ref_ids = route_reference(x.float(), w.float(), b.float(), TOP_K)
    logits = F.linear(x.float(), w.float(), b.float())
    top5 = logits.topk(5, dim=-1).values
    tie_free = ((top5[:, :-1] - top5[:, 1:]) > 2**-7 * top5[:, :-1].abs() + 1e-4).all(dim=1)
    for name, (weights, ids) in (("old", old_path(x, w, b)),
                                 ("fused", router_gemm_topk_triton(x, w, b, TOP_K, counters))):
        assert torch.equal(ids[tie_free], ref_ids[tie_free]), (name, t, e)
        err = (weights[tie_free].float() - ref_w[tie_free]).abs().max().item() if tie_free.any() else 0.0
        assert err < 2e-2, (name, t, e, err)
    assert not counters.any()


def bench(t: int, e: int) -> tuple[tuple[float, float, float, float], list[float]]:
    """(old eager, fused eager, old graph, fused graph) µs, and fused graph µs for each of SPLITS."""
    x, w, b = inputs(t, e)
    counters = router_counters("cuda")

    def old() -> tuple[torch.Tensor, torch.Tensor]:
        return old_path(x, w, b)

    def fused(split: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return router_gemm_topk_triton(x, w, b, TOP_K, counters, split)

    main_times = (us(old), us(fused), graph_us(old), graph_us(fused))
    return main_times, [graph_us(lambda s=s: fused(s)) for s in SPLITS]


def main() -> None:
    for t in TOKENS:
        for e in EXPERTS:
            check(t, e)
    print("correctness: ok")
    rows, sweep = [], []
    for e in EXPERTS:
        for t in TOKENS:
            times, by_split = bench(t, e)
            rows.append((e, t, default_split(HIDDEN, triton.cdiv(t, BLOCK_T)), *times))
            sweep.append((e, t, by_split))
    print(f"\n{torch.cuda.get_device_name()}, bf16, H={HIDDEN}, top-{TOP_K}; eager do_bench medians and "
          f"per-call time inside a CUDA graph of {GRAPH_CALLS} calls (µs)")
    print(f"{'E':>4}{'T':>5}{'split':>6}{'old eager':>11}{'fused eager':>13}{'old graph':>11}"
          f"{'fused graph':>13}{'graph speedup':>15}")
    for e, t, split, oe, fe, og, fg in rows:
        print(f"{e:>4}{t:>5}{split:>6}{oe:>11.1f}{fe:>13.1f}{og:>11.1f}{fg:>13.1f}{og / fg:>14.2f}x")
    print("\nfused kernel per-call µs in a CUDA graph, by H splits per token block:")
    print(f"{'E':>4}{'T':>5}" + "".join(f"{s:>8}" for s in SPLITS))
    for e, t, times in sweep:
        print(f"{e:>4}{t:>5}" + "".join(f"{v:>8.1f}" for v in times))


if __name__ == "__main__":
    main()
