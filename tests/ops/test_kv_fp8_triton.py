"""The Triton kernels with an FP8 KV cache (ops/attention/kv_format.py) against the reference, under
TRITON_INTERPRET=1 on CPU at small odd shapes: every writer of the cache (write_kv, the fused RoPE +
cache write, the fused q/k/v projection + RoPE + cache write) stores the reference's e4m3 codes and
scales, and every reader (the prefill / mixed-batch kernel, the split-KV decode kernel, draft
trees) computes the reference's attention over them: sinks, sliding window, freed (-1) and poisoned
(NaN) blocks as in the bf16 tests. tests/gpu/test_kv_fp8_gpu.py repeats them at gpt-oss's shapes."""

from __future__ import annotations

import os
import zlib

import pytest
import torch

from osserve.config import YarnRope
from osserve.ops.attention.kv_format import FP8_DTYPE, KVCache, dequantize_reference
from osserve.ops.attention.reference import paged_attention_reference, write_kv_reference
from osserve.ops.rope.reference import RopeTable, rope_and_cache_table_reference
from osserve.speculative.tree import DraftTree
from tests.ops.attention_cases import fp8_reference, make_case, quantised, rel_err, run_fp8
from tests.ops.test_attention_tree import random_tree, tree_mask

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA or TRITON_INTERPRET=1",
)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# The decode kernel multiplies in float16 (ops/attention/fp8_triton.py): q and p carry 11 bits, so its
# output is ~3e-4 from the float32 reference here; a lost or doubled scale, or a key seen wrongly, is
# far more. The prefill kernel multiplies in the query's dtype (float32 here): 1e-4.
DECODE_TOL = 2e-3


def assert_same_cache(a: KVCache, b: KVCache) -> None:
    """Byte for byte: codes and scales (untouched slots included)."""
    for x, y in zip(a.tensors(), b.tensors(), strict=True):
        assert torch.equal(x.cpu(), y.cpu())


def assert_close_cache(a: KVCache, b: KVCache, same: float = 0.98) -> None:
    """Where a kernel computes the values it quantises in another order than the reference (its
    float32 rotation, its projection's accumulation), a value near a rounding boundary may land one
    e4m3 step away: the decoded caches agree within one step (2^-3 relative) and nearly every code
    is the reference's."""
    assert a.k_scales is not None and a.v_scales is not None and b.k_scales is not None and b.v_scales is not None
    pairs = ((a.k, a.k_scales, b.k, b.k_scales), (a.v, a.v_scales, b.v, b.v_scales))
    for codes, scales, ref_codes, ref_scales in pairs:
        got = dequantize_reference(codes.cpu(), scales.cpu())
        want = dequantize_reference(ref_codes.cpu(), ref_scales.cpu())
        amax = want.abs().amax(-1, keepdim=True)
        assert ((got - want).abs() <= 2**-3 * want.abs() + amax * 2**-12).all()
        assert (codes.view(torch.uint8) == ref_codes.view(torch.uint8)).float().mean().item() >= same


def fp8_cache(num_blocks: int, block_size: int, kv_heads: int, d: int) -> KVCache:
    return KVCache.allocate(num_blocks, block_size, kv_heads, d, FP8_DTYPE, DEVICE)


def clone(c: KVCache) -> KVCache:
    return KVCache(*(t.clone() for t in (c.k, c.v, c.k_scales, c.v_scales)))  # type: ignore[union-attr]


def wide(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """Random vectors whose magnitudes differ by up to 2^12 between tokens and heads."""
    return torch.randn(shape, generator=g) * torch.exp2(torch.randint(-6, 7, (*shape[:-1], 1), generator=g).float())


@pytest.mark.parametrize("kv_heads,d", [(1, 16), (2, 64), (3, 32)])
def test_write_kv_stores_the_reference_codes_and_scales(kv_heads: int, d: int) -> None:
    from osserve.ops.attention.paged_triton import write_kv_triton

    g = torch.Generator().manual_seed(kv_heads * d)
    k, v = wide((11, kv_heads, d), g), wide((11, kv_heads, d), g)
    slots = torch.randperm(6 * 4, generator=g)[:11]
    slots[[2, 7]] = -1
    ours, ref = fp8_cache(6, 4, kv_heads, d), fp8_cache(6, 4, kv_heads, d)
    write_kv_triton(k.to(DEVICE), v.to(DEVICE), ours.k, ours.v, slots.to(DEVICE), ours.k_scales, ours.v_scales)
    write_kv_reference(k, v, ref.k, ref.v, slots, ref.k_scales, ref.v_scales)
    assert_same_cache(ours, ref)


@pytest.mark.parametrize("t", [1, 5, 17])
@pytest.mark.parametrize("heads,kv_heads,d", [(4, 1, 16), (6, 2, 64)])
def test_rope_and_cache_quantises_as_the_reference(t: int, heads: int, kv_heads: int, d: int) -> None:
    from osserve.ops.rope.rope_triton import rope_and_cache_triton

    g = torch.Generator().manual_seed(t * d + heads)
    q, k, v = torch.randn(t, heads, d, generator=g), wide((t, kv_heads, d), g), wide((t, kv_heads, d), g)
    positions = torch.randint(0, 200, (t,), generator=g)
    slots = torch.randperm(6 * 4, generator=g)[:t]
    slots[::3] = -1
    table = RopeTable.build(YarnRope(), d, 256)
    ref = fp8_cache(6, 4, kv_heads, d)
    q_ref, _ = rope_and_cache_table_reference(q, k, v, positions, table, ref.k, ref.v, slots, ref.k_scales,
                                              ref.v_scales)
    ours = fp8_cache(6, 4, kv_heads, d)
    qo, _ = rope_and_cache_triton(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), table.cos.to(DEVICE),
                                  table.sin.to(DEVICE), ours.k, ours.v, slots.to(DEVICE),
                                  positions=positions.to(DEVICE), k_scales=ours.k_scales, v_scales=ours.v_scales)
    assert (qo.cpu() - q_ref).abs().max().item() < 1e-5
    assert_close_cache(ours, ref)
    assert ours.v_scales is not None and ref.v_scales is not None
    assert torch.equal(ours.v.view(torch.uint8).cpu(), ref.v.view(torch.uint8))  # v is not rotated: exact
    assert torch.equal(ours.v_scales.cpu(), ref.v_scales)


@pytest.mark.parametrize("t", [1, 3, 17])
def test_fused_qkv_rope_quantises_as_the_unfused_path(t: int) -> None:
    from osserve.ops.rope.dispatch import qkv_rope_and_cache
    from osserve.ops.rope.qkv_rope_triton import qkv_rope_cache_triton

    hidden, heads, kv_heads, d = 100, 6, 2, 64
    g = torch.Generator().manual_seed(t)
    rows = (heads + 2 * kv_heads) * d
    x = torch.randn(t, hidden, generator=g)
    head_gain = torch.exp2(torch.randint(-4, 5, (rows // d,), generator=g).float()).repeat_interleave(d)
    w = torch.randn(rows, hidden, generator=g) / hidden**0.5 * head_gain[:, None]  # heads of different magnitudes
    b = torch.randn(rows, generator=g)
    table = RopeTable.build(YarnRope(), d, 300)
    positions = torch.randint(0, 300, (t,), generator=g)
    slots = torch.randperm(8 * 4, generator=g)[:t]
    slots[1::3] = -1
    ref = fp8_cache(8, 4, kv_heads, d)
    q_ref = qkv_rope_and_cache(x, w, b, heads, kv_heads, positions, table, ref, slots)  # on CPU: the unfused reference
    ours = fp8_cache(8, 4, kv_heads, d)
    q = qkv_rope_cache_triton(x.to(DEVICE), w.to(DEVICE), b.to(DEVICE), heads, kv_heads, table.cos.to(DEVICE),
                              table.sin.to(DEVICE), positions.to(DEVICE), ours.k, ours.v, slots.to(DEVICE),
                              ours.k_scales, ours.v_scales)
    assert (q.cpu() - q_ref).abs().max().item() < 1e-4
    assert_close_cache(ours, ref, same=0.95)


BATCHES = {
    "chunk_in_window": [(50, 13)],
    "ctx_around_window": [(9, 9), (16, 16), (40, 40)],
    "mixed": [(5, 5), (64, 1), (33, 20), (70, 3), (1, 1)],
}


@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("window", [None, 8])
@pytest.mark.parametrize("block_size", [4, 16])
def test_prefill_reads_fp8_as_the_reference(batch: str, window: int | None, block_size: int) -> None:
    seed = zlib.crc32(f"{batch}{window}{block_size}".encode()) % 10_000
    case = make_case(BATCHES[batch], 4, 2, 16, block_size, window, device=DEVICE,
                     outside="poison" if seed % 2 else "hole", seed=seed)
    cache = quantised(case)
    assert rel_err(run_fp8(case, cache, is_decode=False), fp8_reference(case, cache)) < 1e-4


@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize("window", [None, 16])
def test_split_kv_decode_reads_fp8_as_the_reference(num_splits: int, window: int | None) -> None:
    case = make_case([(n, 1) for n in (1, 17, 40, 100)], 8, 2, 16, 4, window, device=DEVICE, outside="poison",
                     seed=num_splits * 7 + (window or 0))
    cache = quantised(case)
    out = run_fp8(case, cache, is_decode=True, num_splits=num_splits)
    assert rel_err(out, fp8_reference(case, cache)) < DECODE_TOL


@pytest.mark.parametrize("window", [None, 8])
def test_mixed_batch_split_reads_fp8_as_the_reference(window: int | None) -> None:
    """A mixed batch in two launches (paged_attention_triton's prompt_range): its decodes by the
    float16 decode kernel (hence its tolerance), its prompt chunks by the prefill kernel."""
    seqs = [(40, 1), (33, 20), (95, 1), (17, 3), (1, 1)]
    case = make_case(seqs, 8, 2, 16, 4, window, device=DEVICE, outside="poison", seed=13)
    cache = quantised(case)
    out = run_fp8(case, cache, is_decode=False, prompt_range=(1, 4), num_splits=2)
    assert rel_err(out, fp8_reference(case, cache)) < DECODE_TOL


@pytest.mark.parametrize("value_gain", [2.0**-16, 2.0**26])
def test_decode_keeps_values_of_any_magnitude(value_gain: float) -> None:
    """The decode kernel's float16 products: p times the value scales is taken over the tile's
    largest scale, so tiny values (2^-16: p * scale would be a float16 subnormal of a few bits) and
    huge ones (2^26: their scales pass float16's 65504) are read as exactly as unit ones."""
    case = make_case([(n, 1) for n in (7, 40, 100)], 8, 2, 16, 4, None, device=DEVICE, seed=21)
    case.v_cache.mul_(value_gain)
    cache = quantised(case)
    assert rel_err(run_fp8(case, cache, is_decode=True), fp8_reference(case, cache)) < DECODE_TOL


def test_fp8_attention_is_close_to_the_unquantised() -> None:
    """The scales are applied (and once): the FP8 kernel's output is within e4m3's rounding of
    attention over the float cache, where a lost or doubled scale would be off by orders."""
    case = make_case([(90, 90), (61, 1)], 4, 2, 16, 4, None, device=DEVICE, seed=5)
    g = torch.Generator().manual_seed(2)
    shape = (*case.k_cache.shape[:3], 1)
    case.k_cache.mul_(torch.exp2(torch.randint(-3, 2, shape, generator=g).float()))  # scores of a few units
    case.v_cache.mul_(torch.exp2(torch.randint(-6, 7, shape, generator=g).float()))  # 2^12 between tokens
    cache = quantised(case)
    out = run_fp8(case, cache, is_decode=False)
    exact = paged_attention_reference(case.q, case.k_cache, case.v_cache, case.sinks, case.query_start_loc,
                                      case.seq_lens, case.block_tables, case.scale, None)
    assert 1e-3 < rel_err(out, exact) < 0.05


@pytest.mark.parametrize("window", [None, 8])
def test_tree_rows_read_fp8_as_the_reference(window: int | None) -> None:
    trees = {0: random_tree(6, 1), 2: DraftTree.chain(range(4)), 3: random_tree(20, 2, max_children=4)}
    seqs = [(30, 7), (45, 13), (19, 5), (70, 21)]
    case = make_case(seqs, 4, 2, 16, 4, window, device=DEVICE, seed=13, outside="poison")
    mask = tree_mask(case, trees)
    cache = quantised(case)
    out = run_fp8(case, cache, is_decode=False, tree=mask)
    cpu_mask = type(mask)(mask.bits.cpu(), mask.positions.cpu(), mask.start.cpu())
    assert rel_err(out, fp8_reference(case, cache, cpu_mask)) < 1e-4
