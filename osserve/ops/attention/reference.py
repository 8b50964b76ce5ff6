"""Attention over a paged KV cache, with gpt-oss's sinks and sliding window: the specification.

metadata.py describes the cache layout and block tables. The batch is flat: the T query tokens of
B sequences stand one after another; sequence b owns query rows
query_start_loc[b]:query_start_loc[b+1], which are its last query_len positions of seq_lens[b]
tokens (the cached prefix plus this step's chunk): prefill, chunked prefill and decode are the
same computation.

This file is the specification (plain PyTorch). The Triton kernels implement the same function on
CUDA; dispatch.py chooses.
"""

from __future__ import annotations

import torch


def write_kv_reference(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store this step's k, v [T, kv_heads, head_dim] at their slots (slot -1: not stored)."""
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k[valid].to(k_cache.dtype))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v[valid].to(v_cache.dtype))


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
) -> torch.Tensor:
    """q [T, heads, head_dim] -> [T, heads, head_dim], attending through the paged cache.

    A query at position p sees keys at positions j with j <= p and, on a sliding-window layer,
    p - j < window. Each head's sink logit joins the softmax (in float32) as an extra column
    that takes probability mass but contributes no value.
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
        first_k_pos = 0 if window is None else max(0, first_q_pos - window + 1)
        k_pos = torch.arange(first_k_pos, seq_len, device=q.device)
        blocks = block_tables[b, k_pos // block_size].long()
        rows = blocks * block_size + k_pos % block_size
        keys = k_cache.view(-1, kv_heads, head_dim)[rows].to(torch.float32)  # [S, kvh, D]
        vals = v_cache.view(-1, kv_heads, head_dim)[rows].to(torch.float32)
        keys = keys.repeat_interleave(group, dim=1)  # [S, H, D]
        vals = vals.repeat_interleave(group, dim=1)
        qs = q[q_start:q_end].to(torch.float32)  # [L, H, D]
        scores = torch.einsum("lhd,shd->hls", qs, keys) * scale  # [H, L, S]
        q_pos = torch.arange(first_q_pos, seq_len, device=q.device)
        dist = q_pos[:, None] - k_pos[None, :]
        visible = dist >= 0
        if window is not None:
            visible &= dist < window
        scores = scores.masked_fill(~visible[None], float("-inf"))
        sink_col = sinks.to(torch.float32)[:, None, None].expand(num_heads, q_len, 1)
        probs = torch.softmax(torch.cat((scores, sink_col), dim=-1), dim=-1)[..., :-1]
        out[q_start:q_end] = torch.einsum("hls,shd->lhd", probs, vals).to(q.dtype)
    return out
