"""The Gluon MoE kernel's weight layout (mxfp4/fragments.py) on the CPU: packing the checkpoint's
MXFP4 blocks and dequantising them with the PTX's rotations and masks (emulated bit for bit) gives
back exactly the checkpoint's values. (The kernel itself needs a Hopper GPU: tests/gpu.)"""

from __future__ import annotations

import itertools

import pytest
import torch

from osserve.ops.mxfp4.fragments import (
    BIT_PLACES,
    DEQUANT_PTX,
    emulate_dequant,
    pack_words,
    tile_scales,
    untile_scales,
    untile_words,
    word_columns,
)
from osserve.ops.mxfp4.reference import dequantize_mxfp4


@pytest.mark.parametrize("k", [64, 128, 192, 320, 2880])
def test_pack_then_dequantise_is_exact(k: int) -> None:
    gen = torch.Generator().manual_seed(k)
    blocks = torch.randint(0, 256, (2, 64, k // 32, 16), dtype=torch.uint8, generator=gen)
    scales = torch.randint(100, 140, (2, 64, k // 32), dtype=torch.uint8, generator=gen)
    words = untile_words(pack_words(blocks), k // 8)
    assert words.shape == (2, 64, k // 8) and words.dtype == torch.int32
    ref = dequantize_mxfp4(blocks, scales, torch.float32)
    for expert in range(2):
        assert torch.equal(emulate_dequant(words[expert], scales[expert], k), ref[expert])


@pytest.mark.parametrize("k", [64, 128, 2880])
def test_tile_major_words_run_each_k_step_contiguously(k: int) -> None:
    """pack_words: per 64-row tile the full K steps' [64 rows, 16 words] blocks, then the 64-column
    tail step's [64, 8]: a program reads one contiguous run per step, and the layout is exactly
    the checkpoint's size."""
    blocks = torch.randint(0, 256, (2, 128, k // 32, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(k))
    tiled = pack_words(blocks)
    words = untile_words(tiled, k // 8)  # row-major again
    assert tiled.shape == (2, 2, 64 * k // 8) and tiled.numel() * 4 == blocks.numel()
    full = k // 128
    for r in (0, 5, 63, 64, 127):
        tile = tiled[1, r // 64]
        for j in range(full):
            assert torch.equal(tile[1024 * j + 16 * (r % 64):][:16], words[1, r, 16 * j: 16 * j + 16])
        if k % 128:
            assert torch.equal(tile[1024 * full + 8 * (r % 64):][:8], words[1, r, 16 * full:])
    assert torch.equal(untile_words(tiled, k // 8), words)


@pytest.mark.parametrize("groups", [2, 4, 90])
def test_tile_major_scales_are_whole_steps(groups: int) -> None:
    scales = torch.randint(0, 256, (2, 128, groups), dtype=torch.uint8)
    tiled = tile_scales(scales)
    steps = -(-groups // 4)
    assert tiled.shape == (2, 2, steps, 64, 4) and tiled.is_contiguous()
    for r in (0, 63, 64, 127):
        for j in range(steps):
            want = scales[1, r, 4 * j: 4 * j + 4]
            got = tiled[1, r // 64, j, r % 64]
            assert torch.equal(got[: want.numel()], want) and not got[want.numel():].any()
    assert torch.equal(untile_scales(tiled, groups), scales)


def test_tile_major_needs_whole_64_row_tiles() -> None:
    with pytest.raises(AssertionError):
        tile_scales(torch.zeros(1, 96, 4, dtype=torch.uint8))


def test_every_column_once_and_each_word_in_one_group() -> None:
    cols = word_columns(2880)
    assert sorted(cols.flatten().tolist()) == list(range(2880))
    assert (cols // 32 == cols[:, :1] // 32).all()  # one scale per word


def test_bit_places_tile_the_word_and_match_the_ptx() -> None:
    assert sorted(BIT_PLACES.values()) == list(range(32))
    # the emulator's rotations (4, 10; 6 and 14 merged) are the PTX's
    for n in (4, 10, 6, 14):
        assert f"shf.r.wrap.b32 r, $8, $8, {n};" in DEQUANT_PTX or f"shf.r.wrap.b32 q, $8, $8, {n};" in DEQUANT_PTX
    assert DEQUANT_PTX.count("mul.rn.bf16x2") == 8


def test_no_four_single_rotations_tile_the_word() -> None:
    # Why one register merges two rotations (fragments._MERGED): of all 35,960 sets of four
    # rotations, none places the mask's 8 bits on 32 distinct word bits.
    mask_bits = [b for b in range(32) if 0x81C081C0 >> b & 1]
    sets = list(itertools.combinations(range(32), 4))
    assert len(sets) == 35_960 and len(mask_bits) == 8
    assert not any(len({(b + r) % 32 for r in rs for b in mask_bits}) == 32 for rs in sets)


def test_k_must_be_whole_64_column_steps() -> None:
    with pytest.raises(AssertionError):
        word_columns(96)


def test_prepared_gate_up_rows_pair_gate_and_up_of_eight_columns() -> None:
    """prepare_mxfp4_experts(fragments=True): each 16 rows of gate/up are 8 columns' gates, then
    the same columns' ups (row r and r + 8 in one MMA thread: moe/gluon.py's _split_pairs)."""
    from osserve.ops.moe.layout import prepare_mxfp4_experts
    from tests.ops.moe_fixtures import random_experts

    torch.manual_seed(3)
    ex = random_experts(2, 64, 64)
    prepared = prepare_mxfp4_experts(ex, fragments=True)
    dense = ex.gate_up(torch.float32)  # [E, 2I, H]: gate c at row 2c, up c at 2c + 1
    for expert in range(2):
        got = emulate_dequant(untile_words(prepared.w1, 8)[expert], untile_scales(prepared.s1, 2)[expert], 64)
        for r in range(2 * 64):
            column, is_up = 8 * (r // 16) + r % 8, r % 16 >= 8
            assert torch.equal(got[r], dense[expert, 2 * column + is_up]), r
    assert torch.equal(prepared.b1, torch.cat((ex.gate_up_bias[:, 0::2], ex.gate_up_bias[:, 1::2]), 1).float())
