"""Decode attention at serving batch sizes (one GPU): why a batch of 256 short contexts reads its
KV cache slower than a batch of 128 long ones. Full layers (no window), bf16 cache (--fp8: the FP8
one, its GB/s still over the bf16 bytes, so that the two compare by time), CUDA-graph replays; each
case's GB/s over the K/V bytes it must read. Varies the launch (num_warps, num_stages, key tile,
forced splits) and the cache's block order (shuffled as a long-running server's pool is, or in
order), table printed last.

    PYTHONPATH=$PWD python3 benchmarks/diag/decode_attention_sweep.py [--fp8] [--launches w4s3n256,w8s2n256p2 ...]

--launches: only these launches (w warps, s stages, n keys a tile, optional p forced splits; t the
Triton FP8 kernel, whose launch any w, s or n also picks), after each case's default (an FP8 cache on
sm_90: attention/fp8_decode_gluon.py's kernel).
"""

from __future__ import annotations

import argparse
import itertools
import re

import torch
import triton
import triton.testing

from benchmarks.bench_attention import BS, KVH, build, work
from osserve.ops.attention.kv_format import quantize_reference
from osserve.ops.attention.paged_triton import paged_attention_triton

CASES = [(256, 1024), (256, 2048), (128, 8192)]  # (batch, context)


def parse_launch(spec: str) -> dict[str, int]:
    """'w4s3n256p2' -> num_warps 4, num_stages 3, block_n 256, num_splits 2 (each part optional);
    't' (alone, or with p): the Triton FP8 kernel where the default is the Gluon one (decode_gluon False)."""
    if spec.startswith("t"):
        return {"decode_gluon": False, **(parse_launch(spec[1:]) if spec[1:] else {})}
    names = {"w": "num_warps", "s": "num_stages", "n": "block_n", "p": "num_splits"}
    parts = re.findall(r"([wsnp])(\d+)", spec)
    if not parts or "".join(k + v for k, v in parts) != spec:
        raise SystemExit(f"--launches: cannot read {spec!r} (e.g. w4s3n256p2)")
    return {names[k]: int(v) for k, v in parts}


def time_decode(batch: int, ctx: int, ordered: bool, fp8: bool = False, **kw: int) -> float:
    """Median ms of one decode launch (graph replays)."""
    seqs = [(ctx, 1)] * batch
    q, k, v, sinks, qsl, lens, tables = build(seqs, None)
    scales = {}
    if fp8:
        (k, scales["k_scales"]), (v, scales["v_scales"]) = quantize_reference(k), quantize_reference(v)
    if ordered:  # block i of sequence b at b * blocks + i: each sequence's keys contiguous
        n = triton.cdiv(ctx, BS)
        tables = torch.arange(batch * n, device="cuda", dtype=torch.int32).view(batch, n)
    out = torch.empty_like(q)
    fn = lambda: paged_attention_triton(q, k, v, sinks, qsl, lens, tables, 64 ** -0.5, None,  # noqa: E731
                                        1, ctx, True, out=out, **scales, **kw)
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fp8", action="store_true", help="an FP8 cache (--kv-cache-dtype fp8)")
    ap.add_argument("--launches", default="", help="comma list of launches (module docstring)")
    ap.add_argument("--cases", default=",".join(f"{b}x{c}" for b, c in CASES),
                    help="comma list of BATCHxCONTEXT")
    args = ap.parse_args()
    fp8 = args.fp8
    print(f"device: {torch.cuda.get_device_name()}, triton {triton.__version__}, kv heads {KVH}, block {BS}, "
          f"{'fp8' if fp8 else 'bf16'} cache")
    rows = []
    launches = [dict(num_warps=w, num_stages=s, block_n=n)
                for w, s, n in itertools.product((4, 8), (2, 3, 4), (64, 128))]
    launches += [dict(num_splits=2), dict(num_splits=4), dict(num_warps=8, num_stages=3, num_splits=2)]
    if args.launches:
        launches = [parse_launch(spec) for spec in args.launches.split(",")]
    cases = [tuple(int(n) for n in case.split("x")) for case in args.cases.split(",")]
    for batch, ctx in cases:
        gb = work([(ctx, 1)] * batch, None)[0] / 1e9
        for ordered in (False, True):
            base = time_decode(batch, ctx, ordered, fp8)
            rows.append((batch, ctx, ordered, "default (fp8: Gluon; bf16: 4 warps, 2 stages, 128 keys)", base, gb))
            print(rows[-1], flush=True)
            if ordered:
                continue
            for kw in launches:
                try:
                    ms = time_decode(batch, ctx, ordered, fp8, **kw)
                except Exception as e:  # noqa: BLE001 - a launch that does not fit (shared memory): say so
                    print(f"  {kw}: {type(e).__name__}: {str(e)[:80]}")
                    continue
                rows.append((batch, ctx, ordered, str(kw), ms, gb))
                print(rows[-1], flush=True)
    print("\n| batch | context | blocks | launch | us | GB/s |\n|---|---|---|---|---|---|")
    for batch, ctx, ordered, label, ms, gb in rows:
        print(f"| {batch} | {ctx} | {'in order' if ordered else 'shuffled'} | {label} | {ms * 1e3:.1f} | "
              f"{gb / ms * 1e3:.0f} |")


if __name__ == "__main__":
    main()
