"""The KV-cache tensors: how many blocks each layer group gets, and their allocation.

Two layer groups (model/gpt_oss.py): sliding-window layers never need more than the last
`sliding_window` tokens of a sequence, so their pool is sized for what the running sequences can
hold at once, and everything else goes to the full-attention layers. `dtype` is the cache's
(--kv-cache-dtype): the model's, or FP8 with its scales (ops/attention/kv_format.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from osserve.config import CacheConfig, ModelConfig, SchedulerConfig
from osserve.model.gpt_oss import FULL_GROUP, SLIDING_GROUP, KVCache
from osserve.ops.attention.kv_format import bytes_per_token


@dataclass(frozen=True)
class KVPlan:
    """Blocks per layer group and what they cost."""

    block_size: int
    num_blocks: dict[str, int]
    bytes_per_block: dict[str, int]  # over all layers of the group, k and v (and FP8's scales)

    @property
    def total_bytes(self) -> int:
        return sum(self.num_blocks[g] * self.bytes_per_block[g] for g in self.num_blocks)

    def max_tokens_per_request(self) -> int:
        return self.num_blocks.get(FULL_GROUP, 0) * self.block_size


def layer_groups(cfg: ModelConfig) -> dict[str, list[int]]:
    groups = {SLIDING_GROUP: cfg.sliding_layers, FULL_GROUP: cfg.full_layers}
    return {g: layers for g, layers in groups.items() if layers}


def bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> dict[str, int]:
    per_layer = block_size * bytes_per_token(cfg.num_key_value_heads, cfg.head_dim, dtype)
    return {g: per_layer * len(layers) for g, layers in layer_groups(cfg).items()}


def sliding_blocks_needed(cfg: ModelConfig, cache: CacheConfig, sched: SchedulerConfig) -> int:
    """Enough sliding-window blocks for every running sequence's window plus one step's chunk.

    A sequence holds at most ceil((window - 1) / block) + 1 blocks for its window, plus the blocks
    of the chunk it computes this step; the whole step computes at most max_num_batched_tokens.
    """
    bs = cache.block_size
    per_seq = math.ceil((cfg.sliding_window - 1) / bs) + 2
    return sched.max_num_seqs * per_seq + math.ceil(sched.max_num_batched_tokens / bs)


def plan_kv_cache(
    cfg: ModelConfig, cache: CacheConfig, sched: SchedulerConfig, budget_bytes: int,
    dtype: torch.dtype, extra_full_bytes: int = 0, share_dtype: torch.dtype | None = None,
) -> KVPlan:
    """Split `budget_bytes` between the groups (or use cache.num_blocks for both).
    extra_full_bytes: per full-attention block, a cache beside the model's (the EAGLE3 draft's).
    share_dtype: the dtype the sliding group's spare share is counted in (default the cache's): the
    model's, so that an FP8 cache keeps the sliding blocks a bf16 one would have and gives the bytes
    it saves there to the full-attention layers, where they hold more requests."""
    per_block = bytes_per_block(cfg, cache.block_size, dtype)
    if extra_full_bytes:
        per_block[FULL_GROUP] = per_block.get(FULL_GROUP, 0) + extra_full_bytes
    groups = layer_groups(cfg)
    if cache.num_blocks is not None:
        return KVPlan(cache.block_size, {g: cache.num_blocks for g in groups}, per_block)
    num_blocks: dict[str, int] = {}
    remaining = budget_bytes
    if SLIDING_GROUP in groups:
        # With prefix caching, spare sliding blocks keep cached windows alive: give the sliding
        # group at most a quarter of the budget, at least what the running sequences need.
        need = sliding_blocks_needed(cfg, cache, sched)
        share_block = bytes_per_block(cfg, cache.block_size, share_dtype or dtype)[SLIDING_GROUP]
        share = min(budget_bytes // 4 // max(share_block, per_block[SLIDING_GROUP]), 4 * need)
        num_blocks[SLIDING_GROUP] = max(need, share) if FULL_GROUP in groups else (
            budget_bytes // per_block[SLIDING_GROUP])
        remaining -= num_blocks[SLIDING_GROUP] * per_block[SLIDING_GROUP]
    if FULL_GROUP in groups:
        num_blocks[FULL_GROUP] = remaining // per_block[FULL_GROUP]
    if any(n <= 0 for n in num_blocks.values()):
        raise ValueError(f"KV-cache budget of {budget_bytes / 2**30:.2f} GiB is too small: {num_blocks}")
    return KVPlan(cache.block_size, num_blocks, per_block)


def allocate_kv_caches(
    cfg: ModelConfig, plan: KVPlan, dtype: torch.dtype, device: torch.device
) -> list[KVCache]:
    """One KVCache per layer: k, v [num_blocks of its group, block_size, kv_heads, head_dim] (and
    their scales, FP8)."""
    caches: list[KVCache] = []
    for layer in range(cfg.num_hidden_layers):
        group = SLIDING_GROUP if cfg.window_of(layer) is not None else FULL_GROUP
        caches.append(KVCache.allocate(plan.num_blocks[group], plan.block_size, cfg.num_key_value_heads,
                                       cfg.head_dim, dtype, device))
    return caches
