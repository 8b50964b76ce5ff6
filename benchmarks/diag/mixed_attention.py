"""A mixed step's attention (decodes beside prompt chunks, as serving's steps with a newcomer are),
in one prefill launch against split in two (paged_attention_triton's prompt_range: the decodes by
the split-KV decode kernel, the chunks by the prefill kernel), with the decodes alone and the chunks
alone for scale. gpt-oss's attention shape (64 q heads, 8 kv heads, head_dim 64, 16-token blocks),
full and sliding (128) layers, bf16 and FP8 caches. Checks first (the two launches against the one,
relative error), then µs a layer (CUDA-graph replay, median), table printed last.

    PYTHONPATH=$PWD python3 benchmarks/diag/mixed_attention.py [--cases "256x1536+2x1000,480x1536+1x2048"]

A case "BxC+PxL": B decodes at context C, then P prompts of L new tokens each (no cached prefix).
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.testing

from benchmarks.bench_attention import WINDOW, attention_call
from tests.ops.attention_cases import rel_err


def parse(case: str) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    dec, pre = case.split("+")
    b, c = (int(x) for x in dec.split("x"))
    p, n = (int(x) for x in pre.split("x"))
    return [(c, 1)] * b, [(n, n)] * p


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="256x1536+2x1000,256x1536+1x2048,480x1536+1x2048,32x1536+1x2048")
    args = ap.parse_args()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    rows = []
    for case in args.cases.split(","):
        decodes, prompts = parse(case)
        seqs = decodes + prompts
        split = (len(decodes), len(seqs))
        for fp8 in (False, True):
            for window in (None, WINDOW):
                one, out_one = attention_call(seqs, window, False, fp8)
                two, out_two = attention_call(seqs, window, False, fp8, prompt_range=split)
                one()
                two()
                torch.cuda.synchronize()
                err = rel_err(out_two, out_one.float())
                assert err < (2e-2 if fp8 else 1e-2), (case, fp8, window, err)
                assert not out_two.isnan().any()
                dec, _ = attention_call(decodes, window, True, fp8)
                pre, _ = attention_call(prompts, window, False, fp8)
                t = [triton.testing.do_bench_cudagraph(f, rep=50, return_mode="median") * 1e3
                     for f in (one, two, dec, pre)]
                rows.append((case, "fp8" if fp8 else "bf16", "sliding" if window else "full", err, *t))
                print(f"checked {case} {rows[-1][1]} {rows[-1][2]}: rel err {err:.2e}", flush=True)
    print("\n| case | cache | layer | split vs one launch, rel err | one launch µs | split µs | decodes alone µs "
          "| prompts alone µs |")
    print("|---|---|---|---|---|---|---|---|")
    for case, cache, layer, err, one_us, two_us, dec_us, pre_us in rows:
        print(f"| {case} | {cache} | {layer} | {err:.1e} | {one_us:.1f} | {two_us:.1f} | {dec_us:.1f} | {pre_us:.1f} |")


if __name__ == "__main__":
    main()
