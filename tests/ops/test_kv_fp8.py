"""The FP8 KV format's specification (ops/attention/kv_format.py) on its own: the scale rule (the
largest element on 448), the rounding error it promises, values far outside e4m3's range, each
token's own rounding, and the reference write and attention decoding an FP8 cache exactly as the
float values it stands for."""

from __future__ import annotations

import torch

from osserve.ops.attention.kv_format import (
    FP8_DTYPE,
    KVCache,
    bytes_per_token,
    dequantize_reference,
    quantize_reference,
    token_scales,
)
from osserve.ops.attention.reference import paged_attention_reference, write_kv_reference
from tests.ops.attention_cases import make_case


def wide_vectors(n: int, d: int = 64, seed: int = 0) -> torch.Tensor:
    """n vectors whose magnitudes span 2^-40 .. 2^40 (far beyond e4m3's ±448 and its 2^-9 step)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g) * torch.exp2(torch.randint(-40, 41, (n, 1), generator=g).float())


def test_the_largest_element_is_stored_exactly_to_the_scales_rounding() -> None:
    x = wide_vectors(4000)
    s = token_scales(x)
    assert s.dtype == torch.bfloat16 and torch.equal(s, (x.abs().amax(-1) / 448).bfloat16())
    codes, s2 = quantize_reference(x)
    assert torch.equal(s, s2)
    biggest = x.abs().argmax(-1, keepdim=True)
    back, want = dequantize_reference(codes, s).gather(1, biggest), x.gather(1, biggest)
    assert ((back - want).abs() <= 2**-8 * want.abs()).all()  # 448 · s: only the bf16 scale's rounding
    assert (codes.float().abs().amax(-1) == 448).all()  # e4m3's largest value, never beyond


def test_relative_error_is_at_most_one_sixteenth_above_the_subnormal_range() -> None:
    x = wide_vectors(4000)
    codes, s = quantize_reference(x)
    assert codes.dtype == FP8_DTYPE
    back = dequantize_reference(codes, s)
    assert torch.isfinite(back).all()
    amax = x.abs().amax(-1, keepdim=True)
    # e4m3's normal range (>= 2^-6, the largest element at 448 = 2^8.8): elements >= max|x| · 2^-14
    normal = x.abs() >= amax * 2**-14
    rel = ((back - x).abs() / x.abs())[normal]
    assert rel.max().item() <= 2**-4 + 1e-6
    # below it (subnormal codes) the error is absolute: at most half of the 2^-9 step, scaled (<= max|x| · 2^-18)
    small_err = (back - x).abs()[~normal] / (amax.expand_as(x)[~normal] * 2**-18)
    assert small_err.numel() == 0 or small_err.max().item() <= 1.0
    # the typical (RMS) relative error of e4m3's rounding: ~2-3%
    assert 0.01 < (rel**2).mean().sqrt().item() < 0.04


def test_zeros_and_vectors_on_the_grid_are_exact() -> None:
    grid = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8_DTYPE).float()
    grid = grid[grid.isfinite()]  # max 448: scale 1, every code its own value
    x = torch.cat([grid, torch.zeros(2)])[None, :]
    codes, s = quantize_reference(x)
    assert s.item() == 1.0 and torch.equal(dequantize_reference(codes, s), x)
    zero_codes, zero_s = quantize_reference(torch.zeros(2, 64))
    assert (zero_s == 0).all() and torch.equal(dequantize_reference(zero_codes, zero_s), torch.zeros(2, 64))


def test_each_tokens_rounding_differs_from_its_neighbours() -> None:
    """A component every token shares (a projection's bias) is rounded on each token's own grid, so
    its error averages out over many keys, where a fixed scale repeats the same error in every one."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 64, generator=g)
    x[:, 0] = 0.7  # the same value in every token (not its largest)
    err = dequantize_reference(*quantize_reference(x))[:, 0] - 0.7
    fixed = (x[:, 0] / (x.abs().amax() / 448)).clamp(-448, 448).to(FP8_DTYPE).float() * (x.abs().amax() / 448) - 0.7
    assert err.std() > 0 and err.mean().abs() < 0.3 * err.abs().mean()  # signs vary: a mean near 0
    assert fixed.std() == 0 and fixed.abs().mean() > 0  # one error, repeated


def test_an_fp8_cache_costs_a_bf16_scale_per_64_values() -> None:
    assert bytes_per_token(8, 64, torch.bfloat16) == 2 * 8 * 128
    assert bytes_per_token(8, 64, FP8_DTYPE) == 2 * 8 * 66
    assert bytes_per_token(8, 64, torch.bfloat16) / bytes_per_token(8, 64, FP8_DTYPE) > 1.93
    cache = KVCache.allocate(3, 16, 8, 64, FP8_DTYPE, "cpu")
    assert cache.fp8 and cache.k_scales is not None and cache.k_scales.shape == (3, 16, 8)
    assert [t.dtype for t in cache.tensors()] == [torch.uint8, torch.uint8, torch.bfloat16, torch.bfloat16]
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
