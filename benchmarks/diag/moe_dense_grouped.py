"""Diagnostic: the MoE at prompt and mixed-step sizes by path: the Gluon 4-bit kernel (the dispatch's
choice up to 4,096 tokens), the dense path (moe/dense.py: the layer dequantised once, two grouped
GEMMs) and, with --baseline, an older dense.py (`git show REV:osserve/ops/moe/dense.py > F`: until
2026-11-27 a host loop over the experts). Uniform routing at 20b or 120b expert shapes; each path is
checked against the float32 reference, then timed eagerly (the old dense path reads counts on the
host) over rotated layers, with its peak of fresh memory. Run on the GPU:
PYTHONPATH=$PWD python3 benchmarks/diag/moe_dense_grouped.py [--model 20b] [--tokens ...] [--baseline F]
"""

from __future__ import annotations

import argparse
from functools import partial

import torch
from triton.testing import do_bench

from benchmarks.bench_moe import EXPERT_PARAMS
from benchmarks.bench_moe_decode import HIDDEN, INTER, LIMIT, MODELS, load_baseline, rel_err, timing_inputs
from osserve.ops.moe.dense import moe_prefill_dense
from osserve.ops.moe.gluon import fused_moe_gluon
from osserve.ops.moe.layout import prepare_mxfp4_experts
from osserve.ops.moe.reference import moe_reference
from tests.ops.moe_fixtures import random_experts

EXPERT_FLOPS = 2 * EXPERT_PARAMS  # a token's flops on one expert


def eager_us(fns: list) -> float:  # type: ignore[type-arg]
    """Median µs of one call, cycling through `fns` (one a layer) in each timed round."""

    def run() -> None:
        for fn in fns:
            fn()

    return do_bench(run, warmup=10, rep=200, return_mode="median") * 1e3 / len(fns)


def peak_gib(fn) -> float:  # type: ignore[no-untyped-def]
    """GiB one call allocates above what was allocated before it, at its peak."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**30


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="20b")
    parser.add_argument("--tokens", default="2304,4096,8192,16384")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--baseline", help="an older moe/dense.py to time beside the current one")
    args = parser.parse_args()
    num_experts, _ = MODELS[args.model]
    baseline = load_baseline(args.baseline)
    props = torch.cuda.get_device_properties(0)
    print(f"GPU {props.name}, {props.multi_processor_count} SMs; torch {torch.__version__}", flush=True)
    torch.manual_seed(0)
    layers = [random_experts(num_experts, HIDDEN, INTER, device="cuda") for _ in range(args.layers)]
    fragments = [prepare_mxfp4_experts(ex, fragments=True) for ex in layers]
    rows = []
    for t in (int(v) for v in args.tokens.split(",")):
        x, w, ids, _ = timing_inputs(t, num_experts)
        ref = moe_reference(x.float(), w.float(), ids, layers[0], LIMIT)
        paths = {"gluon": [partial(fused_moe_gluon, x, w, ids, f, LIMIT) for f in fragments],
                 "dense": [partial(moe_prefill_dense, x, w, ids, ex, LIMIT) for ex in layers]}
        if baseline is not None:
            paths["dense before"] = [partial(baseline.moe_prefill_dense, x, w, ids, ex, LIMIT) for ex in layers]
        times, peaks = {}, {}
        for name, fns in paths.items():
            err = rel_err(fns[0](), ref)
            assert err < 2e-2, (t, name, err)
            peaks[name] = peak_gib(fns[0])
            times[name] = eager_us(fns)
        rows.append((t, times, peaks))
        print(f"T={t}: " + ", ".join(f"{k} {v:.1f} µs ({t * 4 * EXPERT_FLOPS / v / 1e6:.0f} TFLOP/s, "
                                     f"{peaks[k]:.2f} GiB)" for k, v in times.items()), flush=True)
    names = list(rows[0][1])
    print(f"\n{args.model} experts, µs a layer (GiB of fresh memory at the call's peak)\n")
    print(f"| T | {' | '.join(names)} |")
    print("|---" * (len(names) + 1) + "|")
    for t, times, peaks in rows:
        print(f"| {t} | " + " | ".join(f"{times[n]:.1f} ({peaks[n]:.2f})" for n in names) + " |")


if __name__ == "__main__":
    main()
