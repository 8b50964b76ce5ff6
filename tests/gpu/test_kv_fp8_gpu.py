"""`--kv-cache-dtype fp8` on the GPU (ops/attention/kv_format.py): the kernels against the reference at
gpt-oss's shapes (64 q / 8 kv heads, head_dim 64, window 128, block 16; the 20b's and the 120b's), and
the dummy models end to end. tests/ops/test_kv_fp8_triton.py runs the same kernels on CPU under
TRITON_INTERPRET=1 at small shapes.

Kernels: the writers (write_kv, the fused RoPE + cache write, the fused projection + RoPE + cache
write) store the reference's codes and scales (bit for bit where they quantise the same float32
values, within one e4m3 step where they compute them in another order); the readers (decode with
and without split-KV, prefill and mixed batches, draft trees) match the reference's attention over
the same FP8 cache as closely as the bf16 kernels match theirs (TOL, tests/gpu/test_attention_gpu.py).

Models, in the bound style of tests/gpu/test_model_gpu.py: decode logits through the fast path (FP8
cache, CUDA graphs) against the float32 reference; the median over steps of |fast - fp32| / |fp32| must
be within 1.5x + 0.01 of the plain-PyTorch path's own error with the same FP8 cache (the kernels add
nothing to the format's error), and that error within 2x + 0.1 of the plain-PyTorch path's with a
bf16 cache (what FP8 itself costs: e4m3's 3 mantissa bits, ~4% median logit error on the CPU's tiny
model against 0.3% for bf16 KV, benchmarks/results/kv-fp8-accuracy-cpu.md; a lost or doubled scale
is off by orders)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from osserve.config import YarnRope
from osserve.engine.load import EngineArgs, build_engine
from osserve.ops.attention.kv_format import FP8_DTYPE, KVCache, dequantize_reference
from osserve.ops.attention.reference import write_kv_reference
from osserve.ops.dispatch import reference_ops
from osserve.ops.rope.reference import RopeTable, rope_and_cache_table_reference
from tests.gpu.test_attention_gpu import PREFILL, decode_case
from tests.gpu.test_model_gpu import LENGTHS, decode_one_by_one, record_logits, reference_logits
from tests.ops.attention_cases import fp8_reference, make_case, quantised, rel_err, run_fp8

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
H, KVH, D, BS, WINDOW, HIDDEN = 64, 8, 64, 16, 128, 2880
TOL = 1e-2


@pytest.mark.parametrize("window", [None, WINDOW])
@pytest.mark.parametrize("batch", [1, 7, 64])
@pytest.mark.parametrize("num_splits", [None, 1, 16])
def test_decode_reads_fp8(window: int | None, batch: int, num_splits: int | None) -> None:
    case = decode_case(window, batch, num_splits)
    cache = quantised(case)
    assert rel_err(run_fp8(case, cache, True, num_splits=num_splits), fp8_reference(case, cache)) < TOL


@pytest.mark.parametrize("window", [None, WINDOW])
@pytest.mark.parametrize("num_splits", [None, 1, 4])
def test_gluon_and_triton_fp8_decode_agree(window: int | None, num_splits: int | None) -> None:
    """attention/fp8_decode_gluon.py (the default on sm_90) against the Triton FP8 kernel over the same
    cache: the same products in another order, so within float16's rounding of p, not TOL; and each
    against the reference."""
    case = decode_case(window, 37, num_splits)
    cache = quantised(case)
    gluon = run_fp8(case, cache, True, num_splits=num_splits, decode_gluon=True)
    triton = run_fp8(case, cache, True, num_splits=num_splits, decode_gluon=False)
    assert rel_err(gluon, triton) < 2e-3
    ref = fp8_reference(case, cache)
    assert rel_err(gluon, ref) < TOL and rel_err(triton, ref) < TOL


@pytest.mark.parametrize("window", [None, WINDOW])
@pytest.mark.parametrize("batch", list(PREFILL))
def test_prefill_reads_fp8(window: int | None, batch: str) -> None:
    case = make_case(PREFILL[batch], H, KVH, D, BS, window, torch.bfloat16, "cuda", outside="poison",
                     seed=len(batch) + (window or 0))
    cache = quantised(case)
    assert rel_err(run_fp8(case, cache, False), fp8_reference(case, cache)) < TOL


def test_draft_trees_read_fp8() -> None:
    from osserve.speculative.tree import DraftTree
    from tests.ops.test_attention_tree import random_tree, tree_mask

    trees = {0: random_tree(20, 1, max_children=4), 1: DraftTree.chain(range(6))}
    case = make_case([(3000, 21), (200, 7), (900, 1)], H, KVH, D, BS, WINDOW, torch.bfloat16, "cuda",
                     outside="poison", seed=3)
    mask = tree_mask(case, trees)
    cache = quantised(case)
    assert rel_err(run_fp8(case, cache, False, tree=mask), fp8_reference(case, cache, mask)) < TOL


def test_write_kv_stores_the_reference_bytes() -> None:
    from osserve.ops.attention.paged_triton import write_kv_triton

    g = torch.Generator(device="cuda").manual_seed(0)
    t = 300
    k = (torch.randn(t, KVH, D, device="cuda", generator=g) * 8).bfloat16()
    v = (torch.randn(t, KVH, D, device="cuda", generator=g) / 8).bfloat16()
    slots = torch.randperm(64 * BS, device="cuda", generator=g)[:t]
    slots[::7] = -1
    ours, ref = (KVCache.allocate(64, BS, KVH, D, FP8_DTYPE, "cuda") for _ in range(2))
    write_kv_triton(k, v, ours.k, ours.v, slots, ours.k_scales, ours.v_scales)
    write_kv_reference(k, v, ref.k, ref.v, slots, ref.k_scales, ref.v_scales)
    assert all(torch.equal(a, b) for a, b in zip(ours.tensors(), ref.tensors(), strict=True))


def close_cache(ours: KVCache, ref: KVCache) -> None:
    """Decoded caches within one e4m3 step plus the reference's bf16 rotation error (the kernels rotate
    in float32; apply_rope rounds cos and sin, both products and their sum to bf16, 2^-9 each on
    terms up to YaRN's concentration times the largest input, so an element that cancels keeps up to
    ~5 * 2^-9 of the vector's largest; a value that moves by it crosses an e4m3 rounding boundary
    about once in ten). Measured on an H100 (2026-11-25): the worst excess 5.0e-3 at t=2048."""
    for codes, scales, ref_codes, ref_scales in ((ours.k, ours.k_scales, ref.k, ref.k_scales),
                                                 (ours.v, ours.v_scales, ref.v, ref.v_scales)):
        got, want = dequantize_reference(codes, scales), dequantize_reference(ref_codes, ref_scales)  # type: ignore[arg-type]
        amax = want.abs().amax(-1, keepdim=True).clamp_min(2**-126)  # empty slots: zeros on both sides
        excess = ((got - want).abs() - 2**-3 * want.abs()) / amax  # beyond one e4m3 step, in the largest's units
        assert (excess <= 2**-6).all(), f"worst excess {excess.max().item():.2e} of the largest element"
        assert (codes.view(torch.uint8) == ref_codes.view(torch.uint8)).float().mean().item() > 0.8


@pytest.mark.parametrize("t", [1, 32, 2048])
def test_rope_cache_writers_quantise_as_the_reference(t: int) -> None:
    """The fused RoPE + cache write (prefill sizes) and the fused projection + RoPE + cache write
    (decode sizes, t <= 32) against rope_and_cache_table_reference, bf16 at the 20b's shapes."""
    from osserve.ops.linear.dispatch import linear
    from osserve.ops.rope.qkv_rope_triton import qkv_rope_cache_triton
    from osserve.ops.rope.rope_triton import rope_and_cache_triton

    g = torch.Generator(device="cuda").manual_seed(t)
    rows = (H + 2 * KVH) * D
    x = torch.randn(t, HIDDEN, device="cuda", generator=g).bfloat16()
    w = (torch.randn(rows, HIDDEN, device="cuda", generator=g) / HIDDEN**0.5).bfloat16()
    b = torch.randn(rows, device="cuda", generator=g).bfloat16()
    table = RopeTable.build(YarnRope(), D, 131072, "cuda")
    positions = torch.randint(0, 131072, (t,), device="cuda", generator=g)
    slots = torch.randperm(256 * BS, device="cuda", generator=g)[:t]
    slots[1::3] = -1
    q, k, v = linear(x, w, b).split([H * D, KVH * D, KVH * D], dim=-1)
    q, k, v = q.reshape(t, H, D), k.reshape(t, KVH, D), v.reshape(t, KVH, D)
    ref = KVCache.allocate(256, BS, KVH, D, FP8_DTYPE, "cuda")
    with reference_ops():
        rope_and_cache_table_reference(q, k, v, positions, table, ref.k, ref.v, slots, ref.k_scales, ref.v_scales)
    ours = KVCache.allocate(256, BS, KVH, D, FP8_DTYPE, "cuda")
    rope_and_cache_triton(q, k, v, table.cos, table.sin, ours.k, ours.v, slots, positions=positions,
                          k_scales=ours.k_scales, v_scales=ours.v_scales)
    close_cache(ours, ref)
    if t <= 32:
        fused = KVCache.allocate(256, BS, KVH, D, FP8_DTYPE, "cuda")
        qkv_rope_cache_triton(x, w, b, H, KVH, table.cos, table.sin, positions, fused.k, fused.v, slots,
                              fused.k_scales, fused.v_scales)
        close_cache(fused, ref)


# ------------------------------------------------------------------------------------------ models


def check_fp8(args: EngineArgs, steps: int) -> None:
    engine = build_engine(args)
    assert all(kv.fp8 for kv in engine.runner.kv_caches)
    model = engine.runner.model
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 199_000, (n,), generator=g).tolist() for n in LENGTHS]
    recorded: list[torch.Tensor] = []
    record_logits(engine.runner, recorded)
    sequences = decode_one_by_one(engine, prompts, steps)  # one sequence at a time, through the decode graphs
    fast = torch.cat(recorded).float()
    rows = [slice(len(p) - 1, None) for p in prompts]
    pairs = list(zip(sequences, rows, strict=True))
    ref_fp8 = torch.cat([reference_logits(model, s, FP8_DTYPE)[r].float() for s, r in pairs])
    ref_bf16 = torch.cat([reference_logits(model, s)[r].float() for s, r in pairs])
    model.float()
    ref = torch.cat([reference_logits(model, s)[r] for s, r in pairs])

    def err(x: torch.Tensor) -> float:
        return ((x - ref).norm(dim=1) / ref.norm(dim=1)).median().item()

    fast_err, fp8_err, bf16_err = err(fast), err(ref_fp8), err(ref_bf16)
    print(f"decode logits vs fp32: fp8 fast path {fast_err:.4f}, fp8 reference {fp8_err:.4f}, bf16 reference "
          f"{bf16_err:.4f}")
    assert fast_err <= 1.5 * fp8_err + 0.01
    assert fp8_err <= 2 * bf16_err + 0.1


def test_tiny_fp8_fast_path_matches_reference(tiny_checkpoint: Path) -> None:
    check_fp8(EngineArgs(model=str(tiny_checkpoint), max_model_len=4096, kv_cache_gb=1, kv_cache_dtype="fp8"),
              steps=64)


def test_dummy_20b_fp8_fast_path_matches_reference() -> None:
    check_fp8(EngineArgs(load_format="dummy", preset="20b", max_model_len=4096, max_num_seqs=64, kv_cache_gb=2,
                         kv_cache_dtype="fp8"), steps=32)
