"""How one layer's paged KV cache is stored: in the model's dtype, or in FP8 (e4m3) with a
power-of-two scale per token and kv head (`--kv-cache-dtype fp8`). The specification of both.

FP8: each token's vector x [head_dim] of one kv head is stored as the e4m3 codes of x · 2^-e and
one byte s = e + 127 (an E8M0 exponent, as MXFP4's scales), with e = floor(log2 max|x|) - 7: the
largest element lands in [128, 256), inside e4m3's ±448, so nothing saturates, and every element
above max|x| · 2^-13 keeps e4m3's full 3-bit mantissa (a relative error of at most 2^-4). Decoding
is exact: code · 2^e. Why per token and head (benchmarks/kv_fp8_accuracy.py measures it): no
calibration and no checkpoint scales needed (gpt-oss ships none), nothing can clip whatever the
activations' range, and a scale is written once with its token and never changes, so CUDA graphs,
prefix caching (blocks shared, or copied with their scales), preemption (recomputed) and chunked
prefill need nothing of their own. It costs one byte per 64: 1.97x the tokens of bf16, not 2x.

The kernels fold the scales into what they compute anyway: a key's into its column of the scores
(q·k · 2^e_k), a value's into its column of the probabilities (p · 2^e_v before p @ V).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_DTYPE = torch.float8_e4m3fn
SCALE_DTYPE = torch.uint8
SCALE_BIAS = 127  # stored byte s means 2^(s - 127)
EXPONENT_OFFSET = 7  # e = floor(log2 max|x|) - 7: max|x| · 2^-e in [2^7, 2^8)
E4M3_MAX = 448.0


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype == FP8_DTYPE


@dataclass(frozen=True)
class KVCache:
    """One layer's paged cache. k, v: [num_blocks, block_size, kv_heads, head_dim]; FP8 caches
    also hold their scales [num_blocks, block_size, kv_heads] (uint8, module docstring)."""

    k: torch.Tensor
    v: torch.Tensor
    k_scales: torch.Tensor | None = None
    v_scales: torch.Tensor | None = None

    @classmethod
    def allocate(cls, num_blocks: int, block_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str) -> KVCache:
        shape = (num_blocks, block_size, kv_heads, head_dim)
        if not is_fp8(dtype):
            return cls(*(torch.zeros(shape, dtype=dtype, device=device) for _ in range(2)))
        k, v = (torch.zeros(shape, dtype=torch.uint8, device=device).view(dtype) for _ in range(2))  # code 0: 0.0
        # Scale byte 0 (2^-127): an unwritten slot decodes to 0, as a zeroed bf16 slot does.
        k_scales, v_scales = (torch.zeros(shape[:3], dtype=SCALE_DTYPE, device=device) for _ in range(2))
        return cls(k, v, k_scales, v_scales)

    @property
    def fp8(self) -> bool:
        return self.k_scales is not None

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor of the cache, each [num_blocks, block_size, ...]: a copy of a block or of a
        slot copies the same index of each. FP8 codes as their bytes (PyTorch's CPU index_copy_ and
        equal have no float8), beside their scales."""
        if self.k_scales is None or self.v_scales is None:
            return [self.k, self.v]
        return [self.k.view(torch.uint8), self.v.view(torch.uint8), self.k_scales, self.v_scales]


def bytes_per_token(kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """One token's K and V in one layer, scales included."""
    per_head = head_dim * dtype.itemsize + (SCALE_DTYPE.itemsize if is_fp8(dtype) else 0)
    return 2 * kv_heads * per_head


def scale_bytes(x: torch.Tensor) -> torch.Tensor:
    """The stored exponent byte s [...] for vectors x [..., head_dim]: the biased exponent of
    max|x| (its float32 bits 23..30) less EXPONENT_OFFSET, at least 0 (max|x| < 2^-120 is zero)."""
    amax = x.float().abs().amax(dim=-1)
    biased = (amax.view(torch.int32) >> 23) & 0xFF
    return (biased - EXPONENT_OFFSET).clamp(min=0).to(SCALE_DTYPE)


def scale_values(s: torch.Tensor) -> torch.Tensor:
    """2^(s - 127) as float32, exactly (the byte placed in float32's exponent field; s = 0 is 0.0)."""
    return (s.to(torch.int32) << 23).view(torch.float32)


def quantize_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., head_dim] -> (e4m3 codes [..., head_dim], scale bytes [...])."""
    s = scale_bytes(x)
    inverse = ((254 - s.to(torch.int32)) << 23).view(torch.float32)  # 2^(127 - s), exact
    codes = (x.float() * inverse[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(FP8_DTYPE)
    return codes, s


def dequantize_reference(codes: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """(codes [..., head_dim], scale bytes [...]) -> float32 values."""
    return codes.float() * scale_values(s)[..., None]
