"""The FP8 KV format's specification (ops/attention/kv_format.py) on its own: the scale rule, the
rounding error it promises, values far outside e4m3's range, and the reference write and attention
decoding an FP8 cache exactly as the float values it stands for."""

from __future__ import annotations

import torch

from osserve.ops.attention.kv_format import (
    FP8_DTYPE,
    KVCache,
    bytes_per_token,
    dequantize_reference,
    quantize_reference,
    scale_bytes,
    scale_values,
)
from osserve.ops.attention.reference import paged_attention_reference, write_kv_reference
from tests.ops.attention_cases import make_case


def wide_vectors(n: int, d: int = 64, seed: int = 0) -> torch.Tensor:
    """n vectors whose magnitudes span 2^-40 .. 2^40 (far beyond e4m3's ±448 and its 2^-9 step)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g) * torch.exp2(torch.randint(-40, 41, (n, 1), generator=g).float())


def test_the_largest_element_lands_in_128_256_and_the_scale_is_a_power_of_two() -> None:
    x = wide_vectors(4000)
    s = scale_bytes(x)
    scaled = x.abs().amax(-1) / scale_values(s)
    assert ((scaled >= 128) & (scaled < 256)).all()
    assert torch.equal(torch.frexp(scale_values(s)).mantissa, torch.full_like(scaled, 0.5))  # 2^k exactly


def test_relative_error_is_at_most_one_sixteenth_above_the_subnormal_range() -> None:
    x = wide_vectors(4000)
    codes, s = quantize_reference(x)
    assert codes.dtype == FP8_DTYPE and s.dtype == torch.uint8
    back = dequantize_reference(codes, s)
    assert torch.isfinite(back).all()
    amax = x.abs().amax(-1, keepdim=True)
    # e4m3's normal range (>= 2^-6, with max|x| at 2^7..2^8): elements >= max|x| · 2^-13 at least
    normal = x.abs() >= amax * 2**-13
    rel = ((back - x).abs() / x.abs())[normal]
    assert rel.max().item() <= 2**-4 + 1e-7
    # below it (subnormal codes) the error is absolute: at most half of the 2^-9 step, scaled (<= max|x| · 2^-17)
    small_err = (back - x).abs()[~normal] / (amax.expand_as(x)[~normal] * 2**-17)
    assert small_err.numel() == 0 or small_err.max().item() <= 1.0
    # the typical (RMS) relative error of e4m3's rounding: ~2-3%
    assert 0.01 < (rel**2).mean().sqrt().item() < 0.04


def test_representable_values_and_zeros_are_exact() -> None:
    grid = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8_DTYPE).float()
    grid = grid[grid.isfinite() & (grid.abs() < 256)]  # max 240: scale 2^0, every code its own value
    x = torch.cat([grid, torch.zeros(2)])[None, :].repeat(3, 1) * torch.tensor([[1.0], [2.0**-20], [2.0**30]])
    codes, s = quantize_reference(x)
    assert torch.equal(dequantize_reference(codes, s), x)
    zero_codes, zero_s = quantize_reference(torch.zeros(2, 64))
    assert torch.equal(dequantize_reference(zero_codes, zero_s), torch.zeros(2, 64))


def test_an_fp8_cache_costs_one_scale_byte_per_64_values() -> None:
    assert bytes_per_token(8, 64, torch.bfloat16) == 2 * 8 * 128
    assert bytes_per_token(8, 64, FP8_DTYPE) == 2 * 8 * 65
    assert bytes_per_token(8, 64, torch.bfloat16) / bytes_per_token(8, 64, FP8_DTYPE) > 1.96
    cache = KVCache.allocate(3, 16, 8, 64, FP8_DTYPE, "cpu")
    assert cache.fp8 and cache.k_scales is not None and cache.k_scales.shape == (3, 16, 8)
    assert [t.dtype for t in cache.tensors()] == [torch.uint8] * 4
    assert all(t.shape[:2] == (3, 16) for t in cache.tensors())
    assert not KVCache.allocate(3, 16, 8, 64, torch.bfloat16, "cpu").fp8


def test_the_reference_write_quantises_and_attention_decodes() -> None:
    """Writing k/v into an FP8 cache stores quantize_reference's codes and scales at the slots (none
    elsewhere), and attention over it equals attention over the decoded float values."""
    case = make_case([(40, 40), (23, 1)], 4, 2, 16, 4, None, seed=3)
    cache = KVCache.allocate(case.k_cache.shape[0], 4, 2, 16, FP8_DTYPE, "cpu")
    g = torch.Generator().manual_seed(1)
    k = torch.randn(63, 2, 16, generator=g) * torch.exp2(torch.randint(-8, 9, (63, 2, 1), generator=g).float())
    v = torch.randn(63, 2, 16, generator=g)
    rows = torch.tensor([p for b, n in enumerate((40, 23)) for p in range(n)])
    seq = torch.tensor([b for b, n in enumerate((40, 23)) for _ in range(n)])
    slots = (case.block_tables[seq, rows // 4].long() * 4 + rows % 4)
    slots[5] = -1  # padding: not stored
    write_kv_reference(k, v, cache.k, cache.v, slots, cache.k_scales, cache.v_scales)
    assert cache.k_scales is not None and cache.v_scales is not None
    kq, ks = quantize_reference(k)
    flat_k, flat_s = cache.k.view(-1, 2, 16), cache.k_scales.view(-1, 2)
    stored = slots >= 0
    assert torch.equal(flat_k[slots[stored]].view(torch.uint8), kq[stored].view(torch.uint8))
    assert torch.equal(flat_s[slots[stored]], ks[stored])
    untouched = torch.ones(flat_s.shape[0], dtype=torch.bool)
    untouched[slots[stored]] = False
    assert (flat_s[untouched] == 0).all() and (flat_k[untouched].float() == 0).all()

    out = paged_attention_reference(case.q, cache.k, cache.v, case.sinks, case.query_start_loc, case.seq_lens,
                                    case.block_tables, case.scale, None, k_scales=cache.k_scales,
                                    v_scales=cache.v_scales)
    decoded_k = dequantize_reference(cache.k, cache.k_scales)
    decoded_v = dequantize_reference(cache.v, cache.v_scales)
    expect = paged_attention_reference(case.q, decoded_k, decoded_v, case.sinks, case.query_start_loc,
                                       case.seq_lens, case.block_tables, case.scale, None)
    assert torch.equal(out, expect)
