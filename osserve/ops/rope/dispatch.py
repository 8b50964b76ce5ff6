"""Which RoPE + KV-cache-write implementation runs: on CUDA at decode sizes one kernel projects q/k/v,
rotates q and k and stores k and v (rope/qkv_rope_triton.py); otherwise the projection, then one kernel
for the rotation and the cache write (rope/rope_triton.py); elsewhere the reference."""

from __future__ import annotations

import torch

from osserve.ops.attention.kv_format import KVCache
from osserve.ops.dispatch import use_triton
from osserve.ops.linear.dispatch import linear
from osserve.ops.rope.reference import RopeTable, rope_and_cache_table_reference


def rope_and_cache_table(
    q: torch.Tensor,  # [T, H, D]
    k: torch.Tensor,  # [T, KVH, D]
    v: torch.Tensor,  # [T, KVH, D]
    positions: torch.Tensor,  # [T] int
    table: RopeTable,
    cache: KVCache,
    slot_mapping: torch.Tensor,  # [T] int64, -1: not stored
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dispatch: the fused kernel (gathering cos/sin by position) on CUDA, else the reference.
    An FP8 cache is written quantised (attention/kv_format.py)."""
    if use_triton(q):
        from osserve.ops.rope.rope_triton import rope_and_cache_triton

        return rope_and_cache_triton(q, k, v, table.cos, table.sin, cache.k, cache.v, slot_mapping,
                                     positions=positions, k_scales=cache.k_scales, v_scales=cache.v_scales)
    return rope_and_cache_table_reference(q, k, v, positions, table, cache.k, cache.v, slot_mapping,
                                          cache.k_scales, cache.v_scales)


def qkv_rope_and_cache(
    x: torch.Tensor,  # [T, hidden]
    weight: torch.Tensor,  # [(H + 2·KVH)·D, hidden]: the fused q/k/v projection (Attention.fuse_qkv)
    bias: torch.Tensor,  # [(H + 2·KVH)·D]
    num_heads: int,
    num_kv_heads: int,
    positions: torch.Tensor,  # [T] int
    table: RopeTable,
    cache: KVCache,
    slot_mapping: torch.Tensor,  # [T] int64, -1: not stored
) -> torch.Tensor:
    """Project x to q, k, v, rotate q and k, store k and v at their slots; returns q [T, H, D].
    On CUDA at decode sizes one kernel does it all (rope/qkv_rope_triton.py); otherwise the
    projection, then rope_and_cache_table."""
    head_dim = weight.shape[0] // (num_heads + 2 * num_kv_heads)
    if use_triton(x):
        from osserve.ops.rope.qkv_rope_triton import fits_qkv_rope, qkv_rope_cache_triton

        if fits_qkv_rope(x, weight, head_dim):
            return qkv_rope_cache_triton(x, weight, bias, num_heads, num_kv_heads, table.cos, table.sin,
                                         positions, cache.k, cache.v, slot_mapping, cache.k_scales,
                                         cache.v_scales)
    t = x.shape[0]
    q, k, v = linear(x, weight, bias).split([num_heads * head_dim, num_kv_heads * head_dim,
                                             num_kv_heads * head_dim], dim=-1)
    q, _ = rope_and_cache_table(q.view(t, num_heads, head_dim), k.view(t, num_kv_heads, head_dim),
                                v.view(t, num_kv_heads, head_dim), positions, table, cache, slot_mapping)
    return q
