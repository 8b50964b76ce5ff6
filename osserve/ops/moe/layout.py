"""The fused kernels' weight layouts, made once at load from the checkpoint's MXFP4 tensors.

Triton kernels (swapped.py, tiled.py): gate rows first then up rows ([E, 2I, ...]), and in each
16-byte block the nibbles are re-paired so byte j holds values j (low) and j+16 (high): a tile's low
nibbles then multiply 16 contiguous activation columns (coalesced loads) and the high nibbles the
next 16, two dots per 32-column group, with no in-register interleave; scales stored group-major.
Gluon kernel (gluon.py, Hopper): MMA-fragment words and tile-major scales (ops/mxfp4/fragments.py).
"""

from __future__ import annotations

import torch

from osserve.ops.moe.weights import ExpertWeights, PreparedExperts
from osserve.ops.mxfp4.fragments import pack_words, pair_eights, tile_scales


def _repair_nibbles(blocks: torch.Tensor) -> torch.Tensor:
    """[..., G, 16] uint8 (byte i = values 2i, 2i+1) -> [..., G*16] (byte j = values j, j+16)."""
    vals = torch.stack((blocks & 0x0F, blocks >> 4), dim=-1).flatten(-2)  # [..., G, 32] in order
    return (vals[..., :16] | (vals[..., 16:] << 4)).flatten(-2).contiguous()


def _group_major(scales: torch.Tensor) -> torch.Tensor:
    """[E, rows, G] scales stored with the rows fastest (strides E: G*rows, rows: 1, G: rows).

    A program's [rows, 4 groups] scale tile is then four 16-byte-aligned runs of consecutive rows
    instead of one 4-byte piece per row (rows are H/32 = 90 bytes apart, too short and too
    misaligned for vector loads): fewer L2 sectors per step, and the swapped kernel's layout
    keeps the dequantised weights in registers (NOTES-moe.md). Same logical shape and values."""
    return scales.transpose(1, 2).contiguous().transpose(1, 2)


def prepare_mxfp4_experts(experts: ExpertWeights, fragments: bool = False) -> PreparedExperts:
    """Rearrange the checkpoint's MXFP4 tensors once (at load) into the kernels' layout: the Triton
    kernels' re-paired nibbles, or with `fragments` the Gluon kernel's (moe/gluon.py)."""
    assert experts.gate_up_blocks is not None and experts.gate_up_scales is not None
    assert experts.down_blocks is not None and experts.down_scales is not None

    def deinterleave(t: torch.Tensor) -> torch.Tensor:  # rows [g0 u0 g1 u1 ...] -> [g0 g1 ... u0 u1 ...]
        return torch.cat((t[:, 0::2], t[:, 1::2]), dim=1).contiguous()

    if fragments:
        weights, scales, gate_up_rows = pack_words, tile_scales, pair_eights
    else:
        weights, scales, gate_up_rows = _repair_nibbles, _group_major, deinterleave
    return PreparedExperts(
        w1=weights(gate_up_rows(experts.gate_up_blocks)),
        s1=scales(gate_up_rows(experts.gate_up_scales)),
        b1=deinterleave(experts.gate_up_bias.float()),
        w2=weights(experts.down_blocks),
        s2=scales(experts.down_scales),
        b2=experts.down_bias.float().contiguous(),
        fragments=fragments,
    )
