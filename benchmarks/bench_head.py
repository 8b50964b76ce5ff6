"""The decode head (ops/linear/head_triton.py: lm_head [201088, 2880] bf16 with the greedy argmax) by
config, against the small-M linear + float32 cast + torch.argmax it replaced.

Run on the GPU: PYTHONPATH=$PWD python3 benchmarks/bench_head.py [--tokens 1,32]  (default: 1)
Correctness first (every config: ids equal to torch.argmax of its logits; the logits bit-equal
to the small-M linear's cast up with that kernel's config, within a bf16 rounding with others),
then µs per call, do_bench median over CUDA-graph replays of one call (the weight, 1.16 GB, never
fits the 50 MB L2), and the TB/s of its weight bytes. A table is printed last.
"""

from __future__ import annotations

import argparse
import itertools

import torch
from triton.testing import do_bench

from osserve.ops.linear.head_triton import logits_and_greedy_triton
from osserve.ops.linear.small_m_triton import DEFAULT_CONFIG, LinearConfig, small_m_linear_triton

HIDDEN, VOCAB = 2880, 201088
CONFIGS = [DEFAULT_CONFIG] + [
    LinearConfig(n, k, w, s)
    for n, k, w, s in itertools.product((32, 64, 128), (128, 256), (4, 8), (4, 6))
    if LinearConfig(n, k, w, s) != DEFAULT_CONFIG and (n + 32) * k * 2 * s <= 200_000
]


def graph_us(fn) -> float:  # noqa: ANN001
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return do_bench(g.replay, warmup=5, rep=100, return_mode="median") * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="1")
    args = ap.parse_args()
    torch.manual_seed(0)
    w = (torch.randn(VOCAB, HIDDEN, device="cuda") / HIDDEN**0.5).bfloat16()
    rows = []
    for t in (int(x) for x in args.tokens.split(",")):
        x = torch.randn(t, HIDDEN, device="cuda").bfloat16()
        ref = small_m_linear_triton(x, w, None).float()
        before = graph_us(lambda x=x: small_m_linear_triton(x, w, None).float().argmax(-1))
        rows.append((t, "linear + .float() + argmax", before))
        for cfg in CONFIGS:
            logits, ids = logits_and_greedy_triton(x, w, cfg)
            assert torch.equal(ids, logits.argmax(-1)), cfg
            if cfg == DEFAULT_CONFIG:  # the small-M linear's own config: the same sums, bit for bit
                assert torch.equal(logits, ref)
            else:  # another K order: within a bf16 rounding of each logit (|logit| < 8 here)
                assert (logits - ref).abs().max().item() <= 0.07, cfg
            rows.append((t, str(cfg), graph_us(lambda x=x, cfg=cfg: logits_and_greedy_triton(x, w, cfg))))
    print(f"\n{torch.cuda.get_device_name()}: lm_head [{VOCAB}, {HIDDEN}] bf16")
    print(f"{'T':>3} {'config':<70} {'us':>8} {'TB/s':>6}")
    for t, name, us in rows:
        print(f"{t:>3} {name:<70} {us:8.1f} {w.numel() * 2 / us / 1e6:6.2f}")


if __name__ == "__main__":
    main()
