"""The Gluon MoE kernel's weight layout (mxfp4_fragments.py) on the CPU: packing the checkpoint's
MXFP4 blocks and dequantising them with the PTX's rotations and masks (emulated bit for bit) gives
back exactly the checkpoint's values. (The kernel itself needs a Hopper GPU: tests/gpu.)"""

from __future__ import annotations

import pytest
import torch

from osserve.ops.mxfp4 import dequantize_mxfp4
from osserve.ops.mxfp4_fragments import (
    BIT_PLACES,
    DEQUANT_PTX,
    emulate_dequant,
    pack_words,
    tile_scales,
    untile,
    word_columns,
)


@pytest.mark.parametrize("k", [64, 128, 192, 320, 2880])
def test_pack_then_dequantise_is_exact(k: int) -> None:
    gen = torch.Generator().manual_seed(k)
    blocks = torch.randint(0, 256, (2, 64, k // 32, 16), dtype=torch.uint8, generator=gen)
    scales = torch.randint(100, 140, (2, 64, k // 32), dtype=torch.uint8, generator=gen)
    words = untile(pack_words(blocks), k // 8)
    assert words.shape == (2, 64, k // 8) and words.dtype == torch.int32
    ref = dequantize_mxfp4(blocks, scales, torch.float32)
    for expert in range(2):
        assert torch.equal(emulate_dequant(words[expert], scales[expert], k), ref[expert])


@pytest.mark.parametrize("columns, per_step", [(360, 16), (8, 16), (90, 4), (92, 4)])
def test_tile_major_runs_each_tiles_k_step_contiguously(columns: int, per_step: int) -> None:
    """Row r's columns [per_step * j, per_step * (j + 1)) sit at [r // 64, j, r % 64]: the kernel's
    program for a 64-row tile reads one contiguous run per K step; the last step is zero-padded."""
    rows = 128
    t = torch.arange(2 * rows * columns, dtype=torch.int32).reshape(2, rows, columns)
    if per_step == 16:
        blocks = torch.randint(0, 256, (2, rows, columns // 4, 16), dtype=torch.uint8)
        t = untile(pack_words(blocks), columns)  # words as rows, to tile again below
    tiled = pack_words(blocks) if per_step == 16 else tile_scales(t.to(torch.uint8))
    steps = -(-columns // per_step)
    assert tiled.shape == (2, rows // 64, steps, 64, per_step) and tiled.is_contiguous()
    for r in (0, 5, 63, 64, 127):
        for j in range(steps):
            got = tiled[1, r // 64, j, r % 64]
            want = t[1, r, per_step * j: per_step * (j + 1)].to(got.dtype)
            assert torch.equal(got[: want.numel()], want) and not got[want.numel():].any()
    assert torch.equal(untile(tiled, columns), t.to(tiled.dtype))


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


def test_k_must_be_whole_64_column_steps() -> None:
    with pytest.raises(AssertionError):
        word_columns(96)


def test_prepared_gate_up_rows_pair_gate_and_up_of_eight_columns() -> None:
    """prepare_mxfp4_experts(fragments=True): each 16 rows of gate/up are 8 columns' gates, then
    the same columns' ups (row r and r + 8 in one MMA thread: moe_gluon.py's _split_pairs)."""
    from osserve.ops.moe_triton import prepare_mxfp4_experts
    from tests.ops.moe_fixtures import random_experts

    torch.manual_seed(3)
    ex = random_experts(2, 64, 64)
    prepared = prepare_mxfp4_experts(ex, fragments=True)
    dense = ex.gate_up(torch.float32)  # [E, 2I, H]: gate c at row 2c, up c at 2c + 1
    for expert in range(2):
        got = emulate_dequant(untile(prepared.w1, 8)[expert], untile(prepared.s1, 2)[expert], 64)
        for r in range(2 * 64):
            column, is_up = 8 * (r // 16) + r % 8, r % 16 >= 8
            assert torch.equal(got[r], dense[expert, 2 * column + is_up]), r
    assert torch.equal(prepared.b1, torch.cat((ex.gate_up_bias[:, 0::2], ex.gate_up_bias[:, 1::2]), 1).float())
