"""MXFP4 (OCP microscaling FP4) weights: dequantisation and quantisation.

A block is 32 values along the input dimension, stored as 16 bytes of E2M1 nibbles (low nibble
first: value 2i in the low nibble of byte i, value 2i+1 in the high nibble) and one E8M0 scale byte
meaning 2^(s-127). Checkpoint tensors are `*_blocks` uint8 [E, out, in/32, 16] and `*_scales`
uint8 [E, out, in/32].
"""

from __future__ import annotations

import torch

# E2M1 code points: bit 3 is the sign, bits 0-2 index the magnitudes.
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
BLOCK = 32
SCALE_BIAS = 127


def dequantize_mxfp4(
    blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """[..., G, 16] uint8 nibbles + [..., G] uint8 scales -> [..., G*32] values in `dtype`.

    Exact in float32 and bf16 (an E2M1 value times a power of two is representable) for scale
    bytes up to 252; 6 * 2^126 and above overflow to inf, as in any float32 implementation.
    """
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise TypeError("MXFP4 blocks and scales must be uint8")
    *prefix, groups, nbytes = blocks.shape
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32, device=blocks.device)
    lo = lut[(blocks & 0x0F).long()]
    hi = lut[(blocks >> 4).long()]
    vals = torch.stack((lo, hi), dim=-1).reshape(*prefix, groups, nbytes * 2)
    exp = scales.to(torch.int32) - SCALE_BIAS
    out = torch.ldexp(vals, exp.unsqueeze(-1).to(torch.float32))
    return out.reshape(*prefix, groups * nbytes * 2).to(dtype)


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., K] float (K a multiple of 32) -> (blocks [..., K/32, 16] uint8, scales [..., K/32] uint8).

    Each block's scale is the smallest power of two that brings its largest magnitude within
    E2M1's range (6.0); values round to the nearest code point.
    """
    *prefix, k = w.shape
    if k % BLOCK:
        raise ValueError(f"last dimension {k} is not a multiple of {BLOCK}")
    x = w.detach().to(torch.float32).reshape(*prefix, k // BLOCK, BLOCK)
    amax = x.abs().amax(dim=-1).clamp_min(torch.finfo(torch.float32).tiny)
    exp = torch.ceil(torch.log2(amax / 6.0)).clamp(-SCALE_BIAS, 127)
    scaled = x / torch.exp2(exp).unsqueeze(-1)
    mags = torch.tensor(FP4_VALUES[:8], dtype=torch.float32, device=w.device)
    idx = (scaled.abs().unsqueeze(-1) - mags).abs().argmin(dim=-1)
    code = idx | ((scaled < 0).long() << 3)
    code = code.to(torch.uint8).reshape(*prefix, k // BLOCK, BLOCK // 2, 2)
    blocks = code[..., 0] | (code[..., 1] << 4)
    scales = (exp + SCALE_BIAS).to(torch.uint8)
    return blocks.contiguous(), scales.contiguous()
