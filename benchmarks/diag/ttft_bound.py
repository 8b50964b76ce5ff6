"""How low can issue 38's 20b TTFT p99 at c=256 (1k in / 1k out, 768 requests) go on one GPU?

The first `concurrency` requests reach an idle server together. Whatever the schedule, the k-th of
them to get its first token has waited at least for k whole prompts' prefill (its own and those
before it), so its TTFT is at least k x (one prompt's FLOPs) / (the rate the GPU sustains). The
later requests arrive one at a time as others end, and wait less. Every request's TTFT is at least
its entry in that vector (the later ones' entries 0), and a percentile only grows with the values,
so the vector's p99 (np.percentile, as `osserve bench serve` reports it) bounds the
run's from below.

One prompt's FLOPs come from the model's shapes: the attention projections and router, the top-k
experts (gate/up and down), the attention itself (QK and PV over each position's keys: all before it
on full layers, the window on sliding ones), and the head for the prompt's last token.

    PYTHONPATH=$PWD python3 benchmarks/diag/ttft_bound.py [--preset 20b] [--tflops 699,989]

On a GPU, without --tflops, it times the rates first (bf16): torch.matmul at the layer's dense GEMMs
and at 8192^3 (the card's best case), and torch's grouped GEMM at the experts' shapes with balanced
routing and bf16 weights (a real layer dequantises MXFP4 on top of that, so the bound stays a bound);
then the bound with each part at its own measured rate, and at one rate for all (--tflops, e.g. the
spec sheet's 989 dense bf16 TFLOP/s of an H100 / H200 SXM). Table printed last.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np
import torch

from osserve.config import FULL, ModelConfig, preset


@dataclass(frozen=True)
class PromptFlops:
    """FLOPs of one prompt's prefill, by part."""

    dense: float  # q/k/v/o projections and the router, every layer
    experts: float  # top-k experts' gate/up and down, every layer
    attention: float  # QK and PV over each position's keys
    head: float  # the last token's logits

    @property
    def total(self) -> float:
        return self.dense + self.experts + self.attention + self.head


def prompt_flops(cfg: ModelConfig, length: int) -> PromptFlops:
    h, q, kv, inter = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size
    per_token_dense = 2 * h * (q + 2 * kv) + 2 * q * h + 2 * h * cfg.num_local_experts
    per_token_experts = cfg.num_experts_per_tok * 2 * (h * 2 * inter + inter * h)
    # keys summed over a prompt's positions: all before it on a full layer, the window on a sliding one
    full_keys = length * (length + 1) // 2
    sliding_keys = sum(min(p + 1, cfg.sliding_window) for p in range(length))
    full_layers = sum(kind == FULL for kind in cfg.layer_types)
    layers = cfg.num_hidden_layers
    keys = full_layers * full_keys + (layers - full_layers) * sliding_keys
    return PromptFlops(dense=length * layers * per_token_dense, experts=length * layers * per_token_experts,
                       attention=4.0 * q * keys, head=2.0 * h * cfg.vocab_size)


def ttft_bound(seconds_per_prompt: float, concurrency: int, num_requests: int, pct: float = 99.0) -> float:
    """The pct-th percentile of the lower-bound vector: k x seconds_per_prompt for the first wave's k-th.
    np.percentile, as `osserve bench serve` reports TTFTs (osserve/bench/stats.py)."""
    first_wave = [k * seconds_per_prompt for k in range(1, min(concurrency, num_requests) + 1)]
    return float(np.percentile(first_wave + [0.0] * (num_requests - len(first_wave)), pct))


def measured_rates(cfg: ModelConfig, tokens: int) -> dict[str, float]:
    """TFLOP/s of bf16 GEMMs on this GPU: the layer's dense projections at `tokens` rows, the experts
    as one grouped GEMM each way (balanced routing), and an 8192^3 matmul."""
    from triton.testing import do_bench

    from osserve.ops.moe.dense import grouped_mm

    dev, bf = "cuda", torch.bfloat16
    h, q, kv, inter, e = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size, cfg.num_local_experts
    x = torch.randn(tokens, h, device=dev, dtype=bf)
    w_qkv = torch.randn(h, q + 2 * kv, device=dev, dtype=bf)
    w_o = torch.randn(q, h, device=dev, dtype=bf)
    a = torch.randn(tokens, q, device=dev, dtype=bf)
    rows = tokens * cfg.num_experts_per_tok
    ends = torch.arange(1, e + 1, device=dev, dtype=torch.int32) * (rows // e)
    xs = torch.randn(rows, h, device=dev, dtype=bf)
    w_gu = torch.randn(e, 2 * inter, h, device=dev, dtype=bf) / h**0.5
    w_dn = torch.randn(e, h, inter, device=dev, dtype=bf) / inter**0.5
    ys = torch.randn(rows, inter, device=dev, dtype=bf)
    # correctness first: the grouped GEMM against one mm an expert
    ref = torch.cat([xs[i * (rows // e):(i + 1) * (rows // e)] @ w_gu[i].t() for i in range(e)])
    err = ((grouped_mm(xs, w_gu, ends).float() - ref.float()).norm() / ref.float().norm()).item()
    print(f"grouped GEMM against one mm an expert: relative error {err:.2e}")
    assert err < 1e-2, err
    sq = torch.randn(8192, 8192, device=dev, dtype=bf)
    dense_flops = 2 * tokens * h * (q + 2 * kv) + 2 * tokens * q * h
    dense_ms = do_bench(lambda: x @ w_qkv) + do_bench(lambda: a @ w_o)
    expert_flops = 2 * rows * (h * 2 * inter + inter * h)
    expert_ms = do_bench(lambda: grouped_mm(xs, w_gu, ends)) + do_bench(lambda: grouped_mm(ys, w_dn, ends))
    square_ms = do_bench(lambda: sq @ sq)
    return {"dense": dense_flops / dense_ms / 1e9, "experts": expert_flops / expert_ms / 1e9,
            "square": 2 * 8192**3 / square_ms / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="20b")
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--num-requests", type=int, default=768)
    ap.add_argument("--input-len", type=int, default=1000)
    ap.add_argument("--goal-s", type=float, default=2.0, help="the TTFT p99 goal")
    ap.add_argument("--tokens", type=int, default=16384, help="rows of the timed GEMMs (a prefill step's)")
    ap.add_argument("--tflops", default="", help="comma list of rates (TFLOP/s) to bound at; default: measure")
    args = ap.parse_args()
    cfg = preset(args.preset)
    f = prompt_flops(cfg, args.input_len)
    print(f"{args.preset}, one {args.input_len}-token prompt: {f.total / 1e12:.3f} TFLOP (dense {f.dense / 1e12:.3f}, "
          f"experts {f.experts / 1e12:.3f}, attention {f.attention / 1e12:.3f}, head {f.head / 1e12:.4f})")
    unit = ttft_bound(1.0, args.concurrency, args.num_requests)  # prompts' worth of waiting at p99
    need = unit * f.total / args.goal_s / 1e12
    rows: list[tuple[str, float, float]] = []  # (rates, TFLOP/s overall, bound s)
    if args.tflops:
        for r in (float(v) for v in args.tflops.split(",")):
            rows.append((f"{r:,.0f} for every part", r, unit * f.total / (r * 1e12)))
    else:
        rates = measured_rates(cfg, args.tokens)
        best = max(rates.values())
        per_prompt = (f.dense / rates["dense"] + f.experts / rates["experts"]
                      + (f.attention + f.head) / best) / 1e12
        device = torch.cuda.get_device_name()
        rows.append((f"{device}, measured: dense {rates['dense']:,.0f}, experts {rates['experts']:,.0f} "
                     f"(attention and head at the best, {best:,.0f})", f.total / per_prompt / 1e12, unit * per_prompt))
        rows.append((f"{device}, 8192^3 matmul's {rates['square']:,.0f} for every part", rates["square"],
                     unit * f.total / (rates["square"] * 1e12)))
    print(f"\nTTFT p99 over {args.num_requests} requests at concurrency {args.concurrency}: at least "
          f"{unit:.1f} prompts' prefill; a {args.goal_s:g} s goal needs {need:,.0f} TFLOP/s sustained "
          f"({unit * args.input_len / args.goal_s:,.0f} prompt tokens a second)")
    print("| rates (TFLOP/s) | overall TFLOP/s | TTFT p99 at least, s |\n|---|---|---|")
    for name, overall, bound in rows:
        print(f"| {name} | {overall:,.0f} | {bound:.2f} |")


if __name__ == "__main__":
    main()
