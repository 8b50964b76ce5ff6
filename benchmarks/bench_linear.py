"""Decode-size projections: cuBLAS (q, k, v apart, as the model ran them; q/k/v fused) against the
small-M Triton linear (osserve/ops/linear/small_m_triton.py), at gpt-oss's attention and lm_head shapes.

Run on the GPU: PYTHONPATH=$PWD python3 benchmarks/bench_linear.py [--sweep]
Correctness first (every config against F.linear in float32), then µs per layer from CUDA-graph
replays of LAYERS layers with distinct weights (so the 50 MB L2 holds none of them: 24 layers of
q/k/v/o are 1.27 GB), do_bench median / LAYERS. GB/s counts the weight bytes once per layer.
"""

from __future__ import annotations

import argparse
import itertools

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from osserve.ops.linear.small_m_triton import DEFAULT_CONFIG, LinearConfig, small_m_linear_triton

HIDDEN, Q, KV, VOCAB, LAYERS = 2880, 4096, 512, 201088, 24
TOKENS = (1, 2, 4, 8, 16, 32)  # up to linear_triton.MAX_TOKENS
SPLITS = (1, 2, 3, 4, 6, 8)


def graph_us(fn, layers: int) -> float:  # noqa: ANN001
    """µs per layer of fn(i) for i in range(layers), replayed as one CUDA graph."""
    for i in range(layers):
        fn(i)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(layers):
            fn(i)
    return do_bench(g.replay, warmup=10, rep=100, return_mode="median") * 1e3 / layers


def weights(n: int, k: int, layers: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5,
             torch.randn(n, device="cuda", dtype=torch.bfloat16)) for _ in range(layers)]


def check(configs: list[LinearConfig]) -> None:
    worst = 0.0
    for (n, k), m, cfg in itertools.product([(Q + 2 * KV, HIDDEN), (HIDDEN, Q), (1000, HIDDEN)], TOKENS, configs):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w, b = weights(n, k, 1)[0]
        ref = F.linear(x.float(), w.float(), b.float())
        got = small_m_linear_triton(x, w, b, cfg).float()
        err = ((got - ref).norm() / ref.norm()).item()
        assert err < 1e-2, (n, k, m, cfg, err)
        worst = max(worst, err)
        for splits in SPLITS[1:]:
            parts = small_m_linear_triton(x, w, b, cfg, splits=splits)
            assert ((parts.sum((0, 2)) - ref).norm() / ref.norm()).item() < 1e-4, (n, k, m, cfg, splits)
    print(f"correctness: {len(configs)} configs x 3 shapes x {len(TOKENS)} batch sizes (K splits {SPLITS}), "
          f"worst ||out-ref||/||ref|| = {worst:.2e} (bf16 output rounding)")


def sweep_configs() -> list[LinearConfig]:
    return [LinearConfig(bn, bk, w, s) for bn, bk, w, s in
            itertools.product((32, 64), (128, 256), (4,), (5, 8, 10))]


def sweep_row(ws: list[tuple[torch.Tensor, torch.Tensor]], k: int, tokens: tuple[int, ...],
              cfg: LinearConfig, splits: int = 1) -> list[float]:
    """µs per layer of the small-M kernel over the layers' weights ws, at each of tokens rows."""
    row = []
    for m in tokens:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        row.append(graph_us(lambda i, x=x: small_m_linear_triton(x, *ws[i], cfg, splits=splits), LAYERS))
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true", help="time every config at batch 1 and 32")
    args = ap.parse_args()
    configs = sweep_configs() if args.sweep else [DEFAULT_CONFIG]
    check(configs)

    qkv = weights(Q + 2 * KV, HIDDEN, LAYERS)
    o = weights(HIDDEN, Q, LAYERS)
    qkv_bytes, o_bytes = qkv[0][0].numel() * 2, o[0][0].numel() * 2

    if args.sweep:
        print("\nsweep: µs per layer, fused qkv [5120, 2880] and o [2880, 4096]")
        print("| config (BN, BK, warps, stages) | qkv T=1 | qkv T=32 | o T=1 | o T=32 |")
        print("|---|---|---|---|---|")
        for cfg in configs:
            row = sweep_row(qkv, HIDDEN, (1, 32), cfg) + sweep_row(o, Q, (1, 32), cfg)
            print(f"| {cfg.block_n}, {cfg.block_k}, {cfg.num_warps}, {cfg.num_stages} | "
                  + " | ".join(f"{v:.1f}" for v in row) + " |")
        print("\nK split (float32 partials left unreduced, summed by the next add + RMSNorm): o µs per layer")
        print("| splits | o T=1 | o T=8 | o T=32 |")
        print("|---|---|---|---|")
        for splits in SPLITS:
            row = sweep_row(o, Q, (1, 8, 32), DEFAULT_CONFIG, splits)
            print(f"| {splits} | " + " | ".join(f"{v:.1f}" for v in row) + " |")

    # Separate q, k, v weights for the "as the model ran them" column: views of the fused ones.
    sep = [(w[:Q], w[Q:Q + KV], w[Q + KV:], b[:Q], b[Q:Q + KV], b[Q + KV:]) for w, b in qkv]
    sep = [tuple(t.contiguous() for t in s) for s in sep]
    rows = []
    for m in TOKENS:
        xh = torch.randn(m, HIDDEN, device="cuda", dtype=torch.bfloat16)
        xq = torch.randn(m, Q, device="cuda", dtype=torch.bfloat16)

        def cublas_sep(i: int, xh: torch.Tensor = xh) -> None:
            wq, wk, wv, bq, bk, bv = sep[i]
            F.linear(xh, wq, bq), F.linear(xh, wk, bk), F.linear(xh, wv, bv)

        t_sep = graph_us(cublas_sep, LAYERS)
        t_fused = graph_us(lambda i, xh=xh: F.linear(xh, *qkv[i]), LAYERS)
        t_tri = graph_us(lambda i, xh=xh: small_m_linear_triton(xh, *qkv[i]), LAYERS)
        o_cub = graph_us(lambda i, xq=xq: F.linear(xq, *o[i]), LAYERS)
        o_tri = graph_us(lambda i, xq=xq: small_m_linear_triton(xq, *o[i]), LAYERS)
        rows.append((m, t_sep, t_fused, t_tri, o_cub, o_tri))

    head = torch.randn(VOCAB, HIDDEN, device="cuda", dtype=torch.bfloat16) / HIDDEN**0.5
    head_rows = []
    for m in (1, 32):
        x = torch.randn(m, HIDDEN, device="cuda", dtype=torch.bfloat16)
        head_rows.append((m, graph_us(lambda i, x=x: F.linear(x, head), 1),
                          graph_us(lambda i, x=x: small_m_linear_triton(x, head, None), 1)))

    cfg = DEFAULT_CONFIG
    print(f"\nµs per layer (Triton config BN={cfg.block_n}, BK={cfg.block_k}, {cfg.num_warps} warps, "
          f"{cfg.num_stages} stages); GB/s of weight bytes")
    print("| T | cuBLAS q,k,v apart | cuBLAS qkv fused | Triton qkv | qkv GB/s (Triton) "
          "| cuBLAS o | Triton o | o GB/s (Triton) | layer: cuBLAS apart+o -> Triton |")
    print("|---|---|---|---|---|---|---|---|---|")
    for m, t_sep, t_fused, t_tri, o_cub, o_tri in rows:
        print(f"| {m} | {t_sep:.1f} | {t_fused:.1f} | {t_tri:.1f} | {qkv_bytes / t_tri / 1e3:.0f} | {o_cub:.1f} "
              f"| {o_tri:.1f} | {o_bytes / o_tri / 1e3:.0f} | {t_sep + o_cub:.1f} -> {t_tri + o_tri:.1f} |")
    print("\n| lm_head T | cuBLAS µs | Triton µs | GB/s cuBLAS / Triton |")
    print("|---|---|---|---|")
    for m, cub, tri in head_rows:
        b = head.numel() * 2
        print(f"| {m} | {cub:.1f} | {tri:.1f} | {b / cub / 1e3:.0f} / {b / tri / 1e3:.0f} |")


if __name__ == "__main__":
    main()
