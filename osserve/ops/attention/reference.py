"""Attention over a paged KV cache, with gpt-oss's sinks and sliding window: the specification.

metadata.py describes the cache layout and block tables. The batch is flat: the T query tokens of
B sequences stand one after another; sequence b owns query rows
query_start_loc[b]:query_start_loc[b+1], which are its last query_len positions of seq_lens[b]
tokens (the cached prefix plus this step's chunk): prefill, chunked prefill and decode are the
same computation.

This file is the specification (plain PyTorch). The Triton kernels implement the same function on
CUDA; dispatch.py chooses. An FP8 cache (kv_format.py) comes with its scales: the write quantises,
attention reads the decoded values.
"""

from __future__ import annotations

import torch

from osserve.ops.attention.kv_format import dequantize_reference, quantize_reference
from osserve.ops.attention.metadata import MAX_TREE_TOKENS, TreeMask


def write_kv_reference(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    slot_mapping: torch.Tensor, k_scales: torch.Tensor | None = None, v_scales: torch.Tensor | None = None,
) -> None:
    """Store this step's k, v [T, kv_heads, head_dim] at their slots (slot -1: not stored); with
    scales [num_blocks, block_size, kv_heads] (an FP8 cache), quantised (kv_format.py)."""
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    for x, cache, scales in ((k, k_cache, k_scales), (v, v_cache, v_scales)):
        rows = x[valid]
        if scales is not None:
            codes, s = quantize_reference(rows)
            scales.view(-1, scales.shape[2]).index_copy_(0, slots, s)
            cache, rows = cache.view(torch.uint8), codes.view(torch.uint8)  # CPU index ops lack float8
        cache.view(-1, *cache.shape[2:]).index_copy_(0, slots, rows.to(cache.dtype))


def paged_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    sinks: torch.Tensor,
    query_start_loc: list[int],
    seq_lens: list[int],
    block_tables: torch.Tensor,
    scale: float,
    window: int | None,
    tree: TreeMask | None = None,
    k_scales: torch.Tensor | None = None,
    v_scales: torch.Tensor | None = None,
) -> torch.Tensor:
    """q [T, heads, head_dim] -> [T, heads, head_dim], attending through the paged cache.

    A query at position p sees keys at positions j with j <= p and, on a sliding-window layer,
    p - j < window. Each head's sink logit joins the softmax (in float32) as an extra column
    that takes probability mass but contributes no value. `tree`: draft trees (metadata.TreeMask
    states the rule): a tree's node sees its ancestors, and its real position decides the window.
    k_scales / v_scales: an FP8 cache's scales (kv_format.py); keys and values are decoded with them.
    """
    num_heads, head_dim = q.shape[1], q.shape[2]
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // kv_heads
    out = torch.empty_like(q)
    for b, seq_len in enumerate(seq_lens):
        q_start, q_end = query_start_loc[b], query_start_loc[b + 1]
        q_len = q_end - q_start
        if q_len == 0:
            continue
        first_q_pos = seq_len - q_len
        q_pos = torch.arange(first_q_pos, seq_len, device=q.device)  # cache positions
        real_pos = q_pos if tree is None else tree.positions[q_start:q_end].to(q.device)
        first_k_pos = 0 if window is None else max(0, int(real_pos.min()) - window + 1)
        k_pos = torch.arange(first_k_pos, seq_len, device=q.device)
        blocks = block_tables[b, k_pos // block_size].long()
        rows = blocks * block_size + k_pos % block_size
        if k_scales is not None and v_scales is not None:  # FP8: gathered as bytes (index ops lack float8)
            keys = dequantize_reference(gather_codes(k_cache, rows), k_scales.view(-1, kv_heads)[rows])
            vals = dequantize_reference(gather_codes(v_cache, rows), v_scales.view(-1, kv_heads)[rows])
        else:
            keys = k_cache.view(-1, kv_heads, head_dim)[rows].to(torch.float32)  # [S, kvh, D]
            vals = v_cache.view(-1, kv_heads, head_dim)[rows].to(torch.float32)
        keys = keys.repeat_interleave(group, dim=1)  # [S, H, D]
        vals = vals.repeat_interleave(group, dim=1)
        qs = q[q_start:q_end].to(torch.float32)  # [L, H, D]
        scores = torch.einsum("lhd,shd->hls", qs, keys) * scale  # [H, L, S]
        visible = q_pos[:, None] - k_pos[None, :] >= 0
        if window is not None:
            visible &= real_pos[:, None] - k_pos[None, :] < window
        if tree is not None:
            visible &= tree_visible(tree.bits[q_start:q_end], k_pos - int(tree.start[b]))
        scores = scores.masked_fill(~visible[None], float("-inf"))
        sink_col = sinks.to(torch.float32)[:, None, None].expand(num_heads, q_len, 1)
        probs = torch.softmax(torch.cat((scores, sink_col), dim=-1), dim=-1)[..., :-1]
        out[q_start:q_end] = torch.einsum("hls,shd->lhd", probs, vals).to(q.dtype)
    return out


def gather_codes(cache: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """FP8 codes [S, kv_heads, head_dim] of cache rows `rows`, gathered as their bytes."""
    return cache.view(torch.uint8).view(-1, *cache.shape[2:])[rows].view(cache.dtype)


def tree_visible(bits: torch.Tensor, rel: torch.Tensor) -> torch.Tensor:
    """[L, S] bool: query rows with TreeMask bits [L] against keys at `rel` [S] positions from
    their tree's start: set bits inside the tree's MAX_TREE_TOKENS positions, anything outside."""
    inside = (rel >= 0) & (rel < MAX_TREE_TOKENS)
    bit = (bits.to(torch.int64)[:, None] >> rel.clamp(0, MAX_TREE_TOKENS - 1).to(torch.int64)[None, :]) & 1
    return ~inside[None, :] | (bit != 0)
