"""Temperature sampling of a decode step's logits (ops/sampling/gumbel_triton.py) at serving batch
sizes, over gpt-oss's 201,088-token vocabulary, two ways: the race over float32 logits widened from
the head's bf16 output by a pass of their own (the sampler's input before the head's bf16 output
reached it as it is), and the race over the bf16 logits themselves. Run it in two trees to compare
kernels: the timings are of whichever gumbel_triton.py is on PYTHONPATH.

    PYTHONPATH=$PWD python3 benchmarks/bench_sampling.py [--batches 1,32,256] [--configs 2048:8:4,4096:4:8]

--configs: also time the race over bf16 with these launches, BLOCK:NUM_WARPS:PROGRAMS_PER_SM
(gumbel_argmax_triton's block, num_warps, programs_per_sm), after the default's two timings.

Correctness first (both inputs draw the same ids, a greedy row its argmax), then µs a call
(do_bench median over CUDA-graph replays); a table is printed last.
"""

from __future__ import annotations

import argparse

import torch
from triton.testing import do_bench_cudagraph

from osserve.ops.sampling.gumbel_triton import gumbel_argmax_triton

VOCAB = 201088


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,32,256")
    ap.add_argument("--configs", default="", help="launches to time besides the default (docstring)")
    args = ap.parse_args()
    configs = [dict(zip(("block", "num_warps", "programs_per_sm"), map(int, c.split(":")), strict=True))
               for c in args.configs.split(",") if c]
    extra = []
    rows = []
    for b in (int(x) for x in args.batches.split(",")):
        g = torch.Generator(device="cuda").manual_seed(b)
        logits = (torch.randn(b, VOCAB, device="cuda", generator=g) * 4).to(torch.bfloat16)
        temp = torch.ones(b, device="cuda")
        temp[0] = 0.0  # a greedy row
        seeds = torch.randint(0, 2**62, (b,), device="cuda", generator=g)
        narrow = gumbel_argmax_triton(logits, temp, seeds)
        wide = gumbel_argmax_triton(logits.float(), temp, seeds)
        assert torch.equal(narrow, wide), "bf16 and widened logits drew different ids"
        assert narrow[0].item() == logits[0].float().argmax().item(), "the greedy row is not its argmax"
        widen_us = do_bench_cudagraph(lambda: gumbel_argmax_triton(logits.float(), temp, seeds),  # noqa: B023
                                      rep=200, return_mode="median") * 1e3
        race_us = do_bench_cudagraph(lambda: gumbel_argmax_triton(logits, temp, seeds),  # noqa: B023
                                     rep=200, return_mode="median") * 1e3
        rows.append((b, widen_us, race_us))
        print(rows[-1], flush=True)
        for kw in configs:
            ids = gumbel_argmax_triton(logits, temp, seeds, **kw)
            assert ids[0].item() == narrow[0].item(), f"{kw}: the greedy row is not its argmax"
            us = do_bench_cudagraph(lambda: gumbel_argmax_triton(logits, temp, seeds, **kw),  # noqa: B023
                                    rep=200, return_mode="median") * 1e3
            extra.append((b, kw, us))
            print(extra[-1], flush=True)
    print(f"\n{torch.cuda.get_device_name()}, vocab {VOCAB}, temperature 1 (row 0 greedy)")
    print("| batch | widen + race, us | race over bf16, us |\n|---|---|---|")
    for b, widen_us, race_us in rows:
        print(f"| {b} | {widen_us:.1f} | {race_us:.1f} |")
    if extra:
        print("\n| batch | block : warps : programs a SM | race over bf16, us |\n|---|---|---|")
        for b, kw, us in extra:
            print(f"| {b} | {kw['block']} : {kw['num_warps']} : {kw['programs_per_sm']} | {us:.1f} |")


if __name__ == "__main__":
    main()
