"""Which attention implementation runs: the Triton kernels on CUDA (paged_triton.py, which hands
decode-only batches, and a mixed batch's decodes, to decode_triton.py's split-KV kernel), the
reference elsewhere."""

from __future__ import annotations

import torch

from osserve.ops.attention.kv_format import KVCache
from osserve.ops.attention.metadata import AttentionMetadata, BlockTables
from osserve.ops.attention.reference import paged_attention_reference, write_kv_reference
from osserve.ops.dispatch import use_triton


def write_kv(k: torch.Tensor, v: torch.Tensor, cache: KVCache, slot_mapping: torch.Tensor) -> None:
    """Dispatch: the Triton kernel on CUDA, the reference elsewhere (quantising into an FP8 cache)."""
    if use_triton(cache.k) and cache.k.is_contiguous() and cache.v.is_contiguous():
        from osserve.ops.attention.paged_triton import write_kv_triton

        write_kv_triton(k.contiguous(), v.contiguous(), cache.k, cache.v, slot_mapping, cache.k_scales,
                        cache.v_scales)
        return
    write_kv_reference(k, v, cache.k, cache.v, slot_mapping, cache.k_scales, cache.v_scales)


def paged_attention(
    q: torch.Tensor,
    cache: KVCache,
    sinks: torch.Tensor,
    meta: AttentionMetadata,
    tables: BlockTables,
    scale: float,
    window: int | None,
) -> torch.Tensor:
    """Dispatch: the Triton kernels on CUDA, the reference elsewhere.

    The CUDA path reads only device tensors and host ints from `meta` (no sync). A decode-only
    batch takes the split-KV decode kernel, which is CUDA-graph safe.
    """
    if use_triton(q):
        from osserve.ops.attention.paged_triton import paged_attention_triton

        # A mixed batch's decodes go to the decode kernel (paged_triton.py, prompt_range).
        return paged_attention_triton(
            q, cache.k, cache.v, sinks, meta.query_start_loc, meta.seq_lens, tables.block_tables,
            scale, window, meta.max_query_len, meta.max_seq_len, meta.is_decode_only, tree=meta.tree,
            k_scales=cache.k_scales, v_scales=cache.v_scales, prompt_range=meta.prompt_range,
        )
    query_start_loc = [0]
    for n in meta.query_lens_host:
        query_start_loc.append(query_start_loc[-1] + n)
    return paged_attention_reference(
        q, cache.k, cache.v, sinks, query_start_loc, meta.seq_lens_host, tables.block_tables,
        scale, window, meta.tree, cache.k_scales, cache.v_scales,
    )
