"""Fused small ops (add+RMSNorm, RoPE+KV-cache write, router top-k+softmax) vs the unfused
PyTorch sequences they replace, at gpt-oss shapes (H 2880; 64/8 heads × 64; E 32 and 128).

Run on the GPU: PYTHONPATH=$PWD python3 benchmarks/bench_small_ops.py
Times are eager do_bench medians (µs), launch overhead included: at T=1 that overhead is most of
it, which is the point of fusing (fewer launches); inside a CUDA graph the fused kernels' share
shrinks further. The unfused RoPE path computes cos/sin per step as the model does today.
"""

from __future__ import annotations

import torch
from triton.testing import do_bench

from osserve.config import YarnRope
from osserve.ops.norm.norm_triton import add_rms_norm_triton
from osserve.ops.norm.reference import add_rms_norm_reference
from osserve.ops.rope.reference import RopeTable, rope_and_cache_reference, rope_cos_sin, yarn_inv_freq
from osserve.ops.rope.rope_triton import rope_and_cache_triton
from osserve.ops.router.reference import route_reference
from osserve.ops.router.topk_triton import route_triton

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, BLOCK, TOP_K, EPS = 2880, 64, 8, 64, 16, 4, 1e-5
TOKENS = (1, 32, 8192)
MAX_POS = 131072


def us(fn) -> float:  # noqa: ANN001
    return do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def bench_norm(t: int) -> tuple[float, float]:
    x = torch.randn(t, HIDDEN, device="cuda", dtype=torch.bfloat16)
    res = torch.randn_like(x)
    w = torch.randn(HIDDEN, device="cuda", dtype=torch.bfloat16)
    return (us(lambda: add_rms_norm_triton(x, res, w, EPS)),
            us(lambda: add_rms_norm_reference(x, res, w, EPS)))


def bench_rope(t: int) -> tuple[float, float]:
    q = torch.randn(t, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(t, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    num_blocks = t // BLOCK + 64
    k_cache = torch.zeros(num_blocks, BLOCK, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    positions = torch.randint(0, MAX_POS, (t,), device="cuda")
    slots = torch.randperm(num_blocks * BLOCK, device="cuda")[:t]
    table = RopeTable.build(YarnRope(), HEAD_DIM, MAX_POS, "cuda")
    inv_freq, conc = yarn_inv_freq(YarnRope(), HEAD_DIM)
    inv_freq = inv_freq.to("cuda")

    def unfused() -> None:
        cos, sin = rope_cos_sin(positions, inv_freq, conc)
        rope_and_cache_reference(q, k, v, cos, sin, k_cache, v_cache, slots)

    fused = us(lambda: rope_and_cache_triton(q, k, v, table.cos, table.sin, k_cache, v_cache, slots,
                                             positions=positions))
    return fused, us(unfused)


def bench_router(t: int, e: int) -> tuple[float, float]:
    x = torch.randn(t, HIDDEN, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(e, HIDDEN, device="cuda", dtype=torch.bfloat16) / HIDDEN**0.5
    b = torch.randn(e, device="cuda", dtype=torch.bfloat16)
    return us(lambda: route_triton(x, w, b, TOP_K)), us(lambda: route_reference(x, w, b, TOP_K))


def bench_sampler(b: int, vocab: int = 201088) -> tuple[float, float]:
    """Temperature-1 sampling of b rows (the serving benchmark's default): the fused Gumbel-max
    kernel against the PyTorch race the Sampler runs otherwise (reference_ops forces it)."""
    from osserve.engine.core.sampling_params import SamplingParams
    from osserve.engine.worker.sampler import Sampler, SamplingBatch
    from osserve.ops.dispatch import reference_ops

    logits = torch.randn(b, vocab, device="cuda")
    batch = SamplingBatch.build([SamplingParams(temperature=1.0)] * b, [[1]] * b, [[]] * b, [None] * b,
                                torch.device("cuda"), vocab)
    sampler = Sampler()

    def torch_path() -> None:
        with reference_ops():
            sampler.sample(logits, batch)

    return us(lambda: sampler.sample(logits, batch)), us(torch_path)


def main() -> None:
    rows: list[tuple[str, int, float, float]] = []
    for b in (1, 32, 224):
        rows.append(("sampling T=1, vocab 201k", b, *bench_sampler(b)))
    for t in TOKENS:
        rows.append(("add+rmsnorm", t, *bench_norm(t)))
        rows.append(("rope+kv write", t, *bench_rope(t)))
        for e in (32, 128):
            rows.append((f"router E={e} (incl. GEMM)", t, *bench_router(t, e)))
    print(f"\n{torch.cuda.get_device_name()}, bf16, eager do_bench medians")
    print(f"{'op':<26}{'T':>6}{'fused µs':>11}{'torch µs':>11}{'speedup':>9}")
    for name, t, fused, ref in rows:
        print(f"{name:<26}{t:>6}{fused:>11.1f}{ref:>11.1f}{ref / fused:>8.2f}x")


if __name__ == "__main__":
    main()
