"""YaRN rotary position embedding (rotate-half layout), as gpt-oss uses it: the specification.

cos/sin come from a `RopeTable` built once at load for every position; `rope_and_cache_*_reference`
rotate q/k and store k/v in the paged cache. dispatch.py runs the fused Triton kernels on CUDA.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from osserve.config import YarnRope
from osserve.ops.attention.reference import write_kv_reference


def yarn_inv_freq(rope: YarnRope, head_dim: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [head_dim/2] (float32) and the concentration applied to cos/sin.

    Low frequencies (long wavelengths) are interpolated by `factor`, high ones extrapolated,
    with a linear ramp between the dimensions given by beta_fast and beta_slow.
    """
    base, dim = rope.theta, head_dim

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(rope.original_max_position_embeddings / (num_rotations * 2 * math.pi))) / (
            2 * math.log(base)
        )

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation_weight = 1 - ramp
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    inv_extra = 1.0 / pos_freqs
    inv_inter = 1.0 / (rope.factor * pos_freqs)
    inv_freq = inv_inter * (1 - extrapolation_weight) + inv_extra * extrapolation_weight
    concentration = 0.1 * math.log(rope.factor) + 1.0 if rope.factor > 1 else 1.0
    return inv_freq, concentration


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, concentration: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [T] -> cos, sin [T, head_dim/2] in float32, scaled by the concentration."""
    freqs = positions.to(torch.float32)[:, None] * inv_freq.to(positions.device)[None, :]
    return freqs.cos() * concentration, freqs.sin() * concentration


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, head_dim] rotated by (cos, sin) [T, head_dim/2]; rotate-half, not interleaved."""
    first, second = x.chunk(2, dim=-1)
    c = cos.to(x.dtype)[:, None, :]
    s = sin.to(x.dtype)[:, None, :]
    return torch.cat((first * c - second * s, second * c + first * s), dim=-1)


@dataclass(frozen=True)
class RopeTable:
    """cos/sin [max_positions, head_dim/2] float32, concentration already applied.

    Built once at model load (`RopeTable.build(cfg.rope, cfg.head_dim, max_model_len, device)`;
    32 MiB at 131072 positions × head_dim 64); each step then only gathers rows by position.
    The rows are exactly `rope_cos_sin(arange(max_positions), ...)`, so table and per-step paths
    give bit-identical cos/sin. Positions must be < max_positions (not checked on the GPU).
    """

    cos: torch.Tensor
    sin: torch.Tensor

    @classmethod
    def build(
        cls, rope: YarnRope, head_dim: int, max_positions: int, device: torch.device | str = "cpu"
    ) -> RopeTable:
        inv_freq, concentration = yarn_inv_freq(rope, head_dim)
        positions = torch.arange(max_positions, dtype=torch.int64, device=device)
        cos, sin = rope_cos_sin(positions, inv_freq.to(device), concentration)
        return cls(cos.contiguous(), sin.contiguous())

    @property
    def max_positions(self) -> int:
        return self.cos.shape[0]


def rope_and_cache_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, H, D] and k [T, KVH, D], store k and v [T, KVH, D] into the paged cache
    (quantised, with scales: an FP8 cache, attention/kv_format.py).

    Returns the rotated (q, k). The fused kernel does all of it in one pass.
    """
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    write_kv_reference(k, v, k_cache, v_cache, slot_mapping, k_scales, v_scales)
    return q, k


def rope_and_cache_table_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    table: RopeTable,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """As `rope_and_cache_reference`, with cos/sin gathered from the table at positions [T]."""
    cos, sin = table.cos[positions], table.sin[positions]
    return rope_and_cache_reference(q, k, v, cos, sin, k_cache, v_cache, slot_mapping, k_scales, v_scales)
