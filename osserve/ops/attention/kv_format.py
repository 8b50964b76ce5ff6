"""How one layer's paged KV cache is stored: in the model's dtype, or in FP8 (e4m3) with a scale per
token and kv head (`--kv-cache-dtype fp8`). The specification of both.

FP8: each token's vector x [head_dim] of one kv head is stored as the e4m3 codes of x / s and its
scale s = max|x| / 448 rounded to bf16 (2 bytes): the largest element lands on e4m3's largest value,
448, so it is stored exactly (to the scale's rounding, 2^-9), nothing saturates, and every element
above max|x| · 2^-14 keeps e4m3's full 3-bit mantissa (a relative error of at most 2^-4). Decoding
is code · s. Why per token and head, with the maximum exact (benchmarks/kv_fp8_accuracy.py measures
it against per-tensor, per-head and power-of-two scales): no calibration and no checkpoint scales
(gpt-oss ships none), nothing can clip whatever the activations' range, the few large values that
dominate q · k are kept exactly, and each token's rounding errors differ from its neighbours' (its
own scale), so they average out over the keys attention sums. A scale is written once with its
token and never changes, so CUDA graphs, prefix caching (blocks shared, or copied with their scales),
preemption (recomputed) and chunked prefill need nothing of their own. It costs two bytes per 64:
1.94x the tokens of bf16, not 2x.

The kernels fold the scales into what they compute anyway: a key's into its column of the scores
(q·k · s_k), a value's into its column of the probabilities (p · s_v before p @ V).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_DTYPE = torch.float8_e4m3fn
SCALE_DTYPE = torch.bfloat16
E4M3_MAX = 448.0


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype == FP8_DTYPE


@dataclass(frozen=True)
class KVCache:
    """One layer's paged cache. k, v: [num_blocks, block_size, kv_heads, head_dim]; FP8 caches
    also hold their scales [num_blocks, block_size, kv_heads] (bf16, module docstring)."""

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
        # Scale 0: an unwritten slot decodes to 0, as a zeroed bf16 slot does.
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


def token_scales(x: torch.Tensor) -> torch.Tensor:
    """The scale [...] of vectors x [..., head_dim]: max|x| / 448, rounded to bf16 (to nearest)."""
    return (x.float().abs().amax(dim=-1) / E4M3_MAX).to(SCALE_DTYPE)


def quantize_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., head_dim] -> (e4m3 codes [..., head_dim], bf16 scales [...])."""
    s = token_scales(x)
    divisor = s.float()
    divisor = torch.where(divisor == 0, torch.ones_like(divisor), divisor)  # an all-zero vector: codes 0
    codes = (x.float() / divisor[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(FP8_DTYPE)
    return codes, s


def dequantize_reference(codes: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """(codes [..., head_dim], scales [...]) -> float32 values."""
    return codes.float() * s.float()[..., None]
