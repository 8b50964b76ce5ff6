"""MXFP4 dequantisation against a straightforward float64 implementation, bit for bit."""

from __future__ import annotations

import torch

from osserve.ops.mxfp4.reference import dequantize_mxfp4, quantize_mxfp4

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def dequant_float64(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """One value at a time: nibble i of a block is byte i//2's low (even i) or high (odd i) half."""
    *prefix, groups, nbytes = blocks.shape
    flat_b = blocks.reshape(-1, groups, nbytes).tolist()
    flat_s = scales.reshape(-1, groups).tolist()
    rows = []
    for row_b, row_s in zip(flat_b, flat_s, strict=True):
        row = []
        for grp, s in zip(row_b, row_s, strict=True):
            for byte in grp:
                for nib in (byte & 0xF, byte >> 4):
                    mag = E2M1[nib & 7]
                    row.append((-mag if nib & 8 else mag) * 2.0 ** (s - 127))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float64).reshape(*prefix, groups * nbytes * 2)


def test_dequantize_matches_float64_bit_for_bit() -> None:
    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 5, 4, 16), generator=g, dtype=torch.int32).to(torch.uint8)
    scales = torch.randint(100, 150, (3, 5, 4), generator=g, dtype=torch.int32).to(torch.uint8)
    ours = dequantize_mxfp4(blocks, scales, torch.float32)
    ref = dequant_float64(blocks, scales)
    assert ours.shape == (3, 5, 128)
    assert torch.equal(ours.double(), ref)


def test_extreme_scales_are_exact() -> None:
    blocks = torch.full((1, 2, 16), 0x71, dtype=torch.uint8)  # nibbles 1 (0.5) and 7 (6.0)
    scales = torch.tensor([[1, 252]], dtype=torch.uint8)  # 6 * 2^125 still fits float32
    ours = dequantize_mxfp4(blocks, scales).double()
    assert torch.equal(ours, dequant_float64(blocks, scales))
    assert ours[0, 0].item() == 0.5 * 2.0**-126 and ours[0, 33].item() == 6.0 * 2.0**125


def test_quantize_roundtrips_representable_values_and_bounds_error() -> None:
    g = torch.Generator().manual_seed(1)
    blocks = torch.randint(0, 256, (4, 2, 16), generator=g, dtype=torch.int32).to(torch.uint8)
    scales = torch.randint(120, 130, (4, 2), generator=g, dtype=torch.int32).to(torch.uint8)
    w = dequantize_mxfp4(blocks, scales)
    assert torch.equal(dequantize_mxfp4(*quantize_mxfp4(w)), w)
    x = torch.randn(8, 64, generator=g)
    err = (dequantize_mxfp4(*quantize_mxfp4(x)) - x).abs()
    # Rounding error is at most half the widest step (4 -> 6), i.e. one scale; and the scale, a
    # power of two rounded up from amax / 6, is below amax / 3.
    bound = x.reshape(8, 2, 32).abs().amax(-1).repeat_interleave(32, -1) / 3
    assert (err <= bound + 1e-7).all()
