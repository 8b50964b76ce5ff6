"""MXFP4 expert weights laid out as Hopper MMA left-operand fragments (the Gluon MoE kernel's layout).

The Gluon kernel (moe/gluon.py) computes W @ X^T with the 4-bit weights W as the warpgroup MMA's
left operand, which Hopper reads from registers. A thread of a 4-warp warpgroup holds, for a
64-row x 128-column (K step) tile, rows g and g+8 of its warp's 16 (g = lane // 4) and of each
16-column block the columns 2q, 2q+1, 2q+8, 2q+9 (q = lane % 4): 64 values. Here each row's K
step of 128 values is stored so that those 32 values of one row are 16 contiguous bytes (four
32-bit words), one vector load, and so that each word dequantises to four bf16x2 registers with
a rotate and a mask each (`DEQUANT_PTX`): no shuffles, no shared memory, ~1.6 instructions per
value instead of ~4 (NOTES-moe.md).

Word w of thread q in a K step of S values (S = 128, or 64 for the last step when K % 128 = 64):
  index  q * (S / 32) + 2 * b2 + jw                    (b2 < S / 64, jw in {0, 1})
  holds  the 8 values at columns 64 b2 + 32 jw + 16 jx + 8 jy + 2 q + e  (jx, jy, e in {0, 1})
so a word's 8 values share one 32-value scale group (2 b2 + jw). Output register jj = 2 jx + jy
of a word is (value e=0, value e=1) as bf16x2; its nibble bits sit where `BIT_PLACES` says.

Words and scales are stored tile-major: a kernel program's 64-row tile reads each K step as one
contiguous run (4 KB of words, 256 bytes of scales) instead of 64 pieces of 64 and 4 bytes a row
apart. Words: [E, rows / 64, 64 * K / 8], each tile its full steps' [64, 16] blocks, then the
64-column tail step's [64, 8] (the same bytes as the checkpoint: the 120b has none to spare).
Scales: [E, rows / 64, K steps, 64, 4], the last step zero-padded to 4 groups.
"""

from __future__ import annotations

import torch

# Bits 6..8 of a bf16 are the exponent's two low bits and the mantissa's top bit, bit 15 the sign:
# an E2M1 code (m, e0, e1, s) placed there reads as its value times 2^-126 (DEQUANT_PTX).
_TARGET = (6, 7, 8, 15)
# Output register jj takes its bits from the word rotated right by these amounts (the last one
# merges two rotations: a single one cannot tile 32 bits four times with this bit pattern).
_ROTATIONS = (0, 4, 10)
_MERGED = (6, 14)  # jj = 3: the magnitude's top bit from the first rotation, the rest from the second


def bit_places() -> dict[tuple[int, int, int], int]:
    """(output jj, half e, code bit i) -> the word bit holding it. The four outputs' 32 bits are disjoint."""
    places = {}
    for jj in range(4):
        for e in range(2):
            for i, target in enumerate(_TARGET):
                t = target + 16 * e
                rotation = _ROTATIONS[jj] if jj < 3 else (_MERGED[0] if i == 2 else _MERGED[1])
                places[(jj, e, i)] = (t + rotation) % 32
    assert sorted(places.values()) == list(range(32))
    return places


BIT_PLACES = bit_places()

# One word ($8 / $9) and its group's scale as bf16x2 ($10 / $11) -> four bf16x2 registers each.
# mul.rn.bf16x2 by 2^(s + 64 - 127) is exact: the result is value * 2^(s - 127) * 2^-62 (UNSCALE).
_WORD_PTX = """and.b32 r, {w}, 0x81C081C0;
mul.rn.bf16x2 {o0}, r, {s};
shf.r.wrap.b32 r, {w}, {w}, 4;
and.b32 r, r, 0x81C081C0;
mul.rn.bf16x2 {o1}, r, {s};
shf.r.wrap.b32 r, {w}, {w}, 10;
and.b32 r, r, 0x81C081C0;
mul.rn.bf16x2 {o2}, r, {s};
shf.r.wrap.b32 r, {w}, {w}, 6;
shf.r.wrap.b32 q, {w}, {w}, 14;
and.b32 q, q, 0x80C080C0;
lop3.b32 r, r, 0x01000100, q, 0xEA;
mul.rn.bf16x2 {o3}, r, {s};
"""
DEQUANT_PTX = "{\n.reg .b32 r, q;\n" + _WORD_PTX.format(w="$8", s="$10", o0="$0", o1="$1", o2="$2", o3="$3") \
    + _WORD_PTX.format(w="$9", s="$11", o0="$4", o1="$5", o2="$6", o3="$7") + "}"


def step_columns(step_len: int) -> torch.Tensor:
    """[words, 8 outputs-halves] columns of a K step: entry [w, 2 jj + e] = the column of word w's
    output jj, half e (the layout in the module docstring)."""
    assert step_len in (64, 128)
    groups = step_len // 32
    cols = torch.empty(4 * groups, 8, dtype=torch.long)
    for q in range(4):
        for b2 in range(step_len // 64):
            for jw in range(2):
                word = q * groups + 2 * b2 + jw
                for jj in range(4):
                    jx, jy = divmod(jj, 2)
                    for e in range(2):
                        cols[word, 2 * jj + e] = 64 * b2 + 32 * jw + 16 * jx + 8 * jy + 2 * q + e
    return cols


def word_columns(k: int) -> torch.Tensor:
    """[K/8, 8]: for each word of a row of K values, the row columns of its output halves."""
    assert k % 64 == 0, "fragment layout needs K a multiple of 64"
    parts = []
    for k0 in range(0, k, 128):
        parts.append(step_columns(min(128, k - k0)) + k0)
    return torch.cat(parts)


def _codes(blocks: torch.Tensor) -> torch.Tensor:
    """[..., G, 16] checkpoint bytes (byte i = values 2i low nibble, 2i+1 high) -> [..., G*32] codes."""
    return torch.stack((blocks & 0x0F, blocks >> 4), dim=-1).flatten(-3)


ROW_TILE = 64  # weight rows per Gluon program: one warpgroup MMA's M
STEP_WORDS = 16  # words per row in a 128-column K step
STEP_SCALES = 4  # scale groups per row in a K step


def _row_tiles(rows: int) -> int:
    assert rows % ROW_TILE == 0, "the fragment layout needs whole 64-row tiles (gluon.supported)"
    return rows // ROW_TILE


def _tile_words(words: torch.Tensor) -> torch.Tensor:
    """[rows, W] -> [rows / 64, 64 * W]: per 64-row tile the full steps' [64, 16] blocks, then the
    tail step's [64, W % 16]."""
    rows, width = words.shape
    tiles = _row_tiles(rows)
    full = width // STEP_WORDS * STEP_WORDS
    head = words[:, :full].reshape(tiles, ROW_TILE, full // STEP_WORDS, STEP_WORDS).transpose(1, 2)
    tail = words[:, full:].reshape(tiles, ROW_TILE * (width - full))
    return torch.cat((head.reshape(tiles, -1), tail), dim=1)


def untile_words(tiled: torch.Tensor, width: int) -> torch.Tensor:
    """pack_words' [E, rows / 64, 64 * W] -> [E, rows, W] words, row-major."""
    e, tiles, _ = tiled.shape
    full = width // STEP_WORDS * STEP_WORDS
    head = tiled[..., : ROW_TILE * full].reshape(e, tiles, full // STEP_WORDS, ROW_TILE, STEP_WORDS).transpose(2, 3)
    tail = tiled[..., ROW_TILE * full:].reshape(e, tiles * ROW_TILE, width - full)
    return torch.cat((head.reshape(e, tiles * ROW_TILE, full), tail), dim=-1)


def tile_scales(scales: torch.Tensor) -> torch.Tensor:
    """[E, rows, G] uint8 E8M0 scales -> [E, rows / 64, K steps, 64, 4], zero-padded to whole steps."""
    e, rows, groups = scales.shape
    steps = -(-groups // STEP_SCALES)
    padded = torch.nn.functional.pad(scales, (0, steps * STEP_SCALES - groups))
    return padded.reshape(e, _row_tiles(rows), ROW_TILE, steps, STEP_SCALES).transpose(2, 3).contiguous()


def untile_scales(tiled: torch.Tensor, groups: int) -> torch.Tensor:
    """tile_scales' [E, rows / 64, steps, 64, 4] -> [E, rows, groups], row-major."""
    e, tiles, steps, _, _ = tiled.shape
    return tiled.transpose(2, 3).reshape(e, tiles * ROW_TILE, steps * STEP_SCALES)[..., :groups]


def pack_words(blocks: torch.Tensor) -> torch.Tensor:
    """[E, rows, G, 16] uint8 checkpoint blocks -> [E, rows / 64, 64 * G * 4] int32 words in
    fragment order, tile-major (`untile_words(words, G * 4)` gives them as rows).

    One expert at a time, so that the temporaries stay a few times one expert's values."""
    num_experts, rows, groups, _ = blocks.shape
    device = blocks.device
    cols = word_columns(groups * 32).to(device)  # [W, 8]: the column of each output half
    # word bit p holds bit src_bit[p] of output half src_half[p]
    by_place = sorted((place, 2 * jj + e, i) for (jj, e, i), place in BIT_PLACES.items())
    src_half = torch.tensor([h for _, h, _ in by_place], device=device)
    src_bit = torch.tensor([i for _, _, i in by_place], device=device)
    weight = torch.ones(32, dtype=torch.int64, device=device) << torch.arange(32, device=device)
    out = torch.empty(num_experts, _row_tiles(rows), ROW_TILE * groups * 4, dtype=torch.int32, device=device)
    for expert in range(num_experts):
        codes = _codes(blocks[expert])  # [rows, K] uint8
        halves = codes[:, cols]  # [rows, W, 8]
        bits = (halves[:, :, src_half] >> src_bit.to(torch.uint8)) & 1  # [rows, W, 32]
        word = (bits.to(torch.int64) * weight).sum(-1)
        out[expert] = _tile_words(torch.where(word >= 1 << 31, word - (1 << 32), word).to(torch.int32))
    return out


def pair_eights(t: torch.Tensor) -> torch.Tensor:
    """Checkpoint gate/up rows [E, 2I, ...] (gate c at row 2c, up c at 2c + 1) -> 16-row blocks of
    8 gate rows then the same 8 columns' up rows: block b = gates 8b..8b+7, ups 8b..8b+7.

    A warp's 16 MMA rows then hold gate and up of 8 columns, and the thread with row g also has row
    g + 8: its accumulator has both halves of each of its SwiGLUs (moe/gluon.py), whatever the
    number of 64-row tiles a program takes."""
    e, rows, *rest = t.shape
    assert rows % 16 == 0, "pairing needs the intermediate size a multiple of 8"
    return t.reshape(e, rows // 16, 8, 2, *rest).transpose(2, 3).reshape(t.shape).contiguous()


def emulate_dequant(words: torch.Tensor, scales: torch.Tensor, k: int) -> torch.Tensor:
    """Reference for DEQUANT_PTX on the CPU: [rows, K/8] int32 words + [rows, >= K/32] scales ->
    [rows, K] float32 values (times 1, the 2^-62 already undone). The same rotations and masks as
    the PTX, in int64 so that no sign extension interferes; used by the tests."""
    w = words.to(torch.int64) & 0xFFFFFFFF
    cols = word_columns(k)
    out = torch.zeros(words.shape[0], k, dtype=torch.float32)

    def rotr(x: torch.Tensor, n: int) -> torch.Tensor:
        return ((x >> n) | (x << (32 - n))) & 0xFFFFFFFF if n else x

    regs = [rotr(w, 0) & 0x81C081C0, rotr(w, 4) & 0x81C081C0, rotr(w, 10) & 0x81C081C0,
            (rotr(w, 6) & 0x01000100) | (rotr(w, 14) & 0x80C080C0)]
    for jj, reg in enumerate(regs):
        for e in range(2):
            half = (reg >> (16 * e)) & 0xFFFF  # a bf16 bit pattern: value * 2^-126
            value = (half << 16).to(torch.int32).view(torch.float32) * 2.0**126
            out.scatter_(1, cols[:, 2 * jj + e].expand(words.shape[0], -1), value)
    group_scale = torch.exp2(scales[:, : k // 32].to(torch.float32) - 127)
    return out * group_scale.repeat_interleave(32, dim=1)
