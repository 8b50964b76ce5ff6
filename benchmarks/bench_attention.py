"""Paged attention (Triton) on the GPU at gpt-oss shapes: decode and prefill, sliding and full.

Prints GB/s over the K/V bytes the step actually needs (window-limited contexts) and TFLOP/s
(4 * heads * head_dim per visible (query, key) pair), table last. Decode is timed as CUDA-graph
replays (that also proves the decode path captures); prefill with do_bench (median).
Usage: PYTHONPATH=. python3 benchmarks/bench_attention.py
"""

from __future__ import annotations

import torch
import triton
import triton.testing

from osserve.ops.attention.kv_format import quantize_reference
from osserve.ops.attention.paged_triton import paged_attention_triton

H, KVH, D, BS, WINDOW = 64, 8, 64, 16, 128
BYTES = 2  # bf16


def build(seqs: list[tuple[int, int]], window: int | None, seed: int = 0):
    """Random bf16 cache on the GPU, blocks shuffled."""
    torch.manual_seed(seed)
    nblk = [triton.cdiv(s, BS) for s, _ in seqs]
    total = sum(nblk)
    perm = torch.randperm(total, device="cuda").to(torch.int32)
    tables = torch.full((len(seqs), max(nblk)), -1, dtype=torch.int32, device="cuda")
    used = 0
    for b, n in enumerate(nblk):
        tables[b, :n] = perm[used:used + n]
        used += n
    k = torch.randn(total, BS, KVH, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    ntok = sum(q for _, q in seqs)
    q = torch.randn(ntok, H, D, device="cuda", dtype=torch.bfloat16)
    sinks = torch.randn(H, device="cuda")
    qsl = [0]
    for _, ql in seqs:
        qsl.append(qsl[-1] + ql)
    qsl_t = torch.tensor(qsl, dtype=torch.int32, device="cuda")
    lens_t = torch.tensor([s for s, _ in seqs], dtype=torch.int32, device="cuda")
    return q, k, v, sinks, qsl_t, lens_t, tables


def work(seqs: list[tuple[int, int]], window: int | None) -> tuple[float, float]:
    """(bytes of K/V + q + out needed, flops) for the step."""
    pairs = 0
    kv_tokens = 0
    for s, ql in seqs:
        first = s - ql
        lo = 0 if window is None else max(0, first - window + 1)
        kv_tokens += s - lo
        for p in range(first, s):
            pairs += (p + 1) if window is None else min(p + 1, window)
    bytes_ = kv_tokens * KVH * D * 2 * BYTES + 2 * sum(q for _, q in seqs) * H * D * BYTES
    return bytes_, 4.0 * H * D * pairs


def attention_call(seqs, window, is_decode: bool, fp8: bool = False, **kw):
    """(fn, out): one launch of paged attention over build(seqs, window)'s inputs, writing `out`;
    fp8: the cache as `--kv-cache-dtype fp8` stores it (e4m3 codes and a scale per token and kv head,
    ops/attention/kv_format.py); kw: paged_attention_triton's keywords."""
    q, k, v, sinks, qsl, lens, tables = build(seqs, window)
    if fp8:
        (k, kw["k_scales"]), (v, kw["v_scales"]) = quantize_reference(k), quantize_reference(v)
    out = torch.empty_like(q)
    maxq = max(ql for _, ql in seqs)
    maxs = max(s for s, _ in seqs)
    fn = lambda: paged_attention_triton(q, k, v, sinks, qsl, lens, tables, D ** -0.5, window,  # noqa: E731
                                        maxq, maxs, is_decode, out=out, **kw)
    return fn, out


def time_case(seqs, window, is_decode: bool, fp8: bool = False, **kw) -> float:
    """Median ms of one launch (attention_call's)."""
    fn, out = attention_call(seqs, window, is_decode, fp8, **kw)
    fn()
    torch.cuda.synchronize()
    if is_decode:
        ms = triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
    else:
        ms = triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")
    assert not out.isnan().any()
    return ms


def sdpa_prefill_ms(batch: int, length: int) -> float:
    """Dense causal SDPA (no sinks, no paging, no window) as a yardstick for the full layer."""
    q = torch.randn(batch, H, length, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, KVH, length, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    fn = lambda: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
        q, k, v, is_causal=True, enable_gqa=True)
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def main() -> None:
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    rows = []
    for batch in (1, 32, 128):
        for ctx in (1024, 8192):
            for window in (WINDOW, None):
                seqs = [(ctx, 1)] * batch
                ms = time_case(seqs, window, True)
                b, f = work(seqs, window)
                rows.append(("decode", batch, ctx, "sliding" if window else "full", ms, b, f))
    for window in (WINDOW, None):
        seqs = [(2048, 2048)] * 8
        ms = time_case(seqs, window, False)
        b, f = work(seqs, window)
        rows.append(("prefill", 8, 2048, "sliding" if window else "full", ms, b, f))

    # Small tile sweep (same inputs), to see whether the defaults are near the best.
    print("\nsweep (ms, median):")
    for bm, bn, st in ((64, 32, 2), (64, 64, 3), (128, 32, 2), (128, 32, 3), (128, 64, 2),
                       (128, 64, 3), (128, 128, 2)):
        ms = time_case([(2048, 2048)] * 8, None, False, block_m=bm, block_n=bn, num_stages=st)
        print(f"  prefill full 8x2048 block_m={bm} block_n={bn} stages={st}: {ms:.3f}")
    for bn in (32, 64, 128):
        for batch, ctx in ((1, 8192), (128, 8192)):
            ms = time_case([(ctx, 1)] * batch, None, True, block_n=bn)
            print(f"  decode full B={batch} ctx={ctx} block_n={bn}: {ms * 1e3:.1f} us")
    for splits in (1, 4, 16, 32, 64):
        ms = time_case([(8192, 1)], None, True, num_splits=splits)
        print(f"  decode full B=1 ctx=8192 num_splits={splits}: {ms * 1e3:.1f} us")
    sd = sdpa_prefill_ms(8, 2048)
    _, f = work([(2048, 2048)] * 8, None)
    print(f"  torch SDPA dense causal 8x2048 (yardstick): {sd:.3f} ms, {f / sd / 1e9:.1f} TFLOP/s")

    print(f"\n{'kind':8} {'B':>4} {'ctx':>5} {'layer':8} {'time':>10} {'GB/s':>8} {'TFLOP/s':>8}")
    for kind, batch, ctx, layer, ms, b, f in rows:
        t = f"{ms * 1e3:.1f} us" if ms < 1 else f"{ms:.3f} ms"
        print(f"{kind:8} {batch:4d} {ctx:5d} {layer:8} {t:>10} {b / ms / 1e6:8.0f} {f / ms / 1e9:8.2f}")


if __name__ == "__main__":
    main()
