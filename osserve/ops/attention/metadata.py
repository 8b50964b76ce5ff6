"""What attention needs to know about one batch, built once per step by the runner (engine/worker):
where each sequence's query rows are, how long each sequence is, and each layer group's block
tables and cache slots. Plain dataclasses of tensors and host ints, so no layer syncs the device.

The KV cache of one layer is a pair of tensors [num_blocks, block_size, kv_heads, head_dim].
A sequence's token at position p lives in block `block_table[p // block_size]`, row
`p % block_size`. Sliding-window layers free blocks that fall out of the window, leaving -1 holes
in their block tables: attention never reads positions older than the window, so never a hole.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class BlockTables:
    """The block tables of one layer group (sliding or full) for one batch."""

    block_tables: torch.Tensor  # [B, max_blocks] int32, -1 where a block was freed
    slot_mapping: torch.Tensor  # [T] int64: cache row (block * block_size + offset) per new token


@dataclass
class AttentionMetadata:
    """Everything attention needs about one batch; built once per step by the runner."""

    query_start_loc: torch.Tensor  # [B+1] int32, on the model's device
    seq_lens: torch.Tensor  # [B] int32: tokens in the cache after this step, per sequence
    query_lens_host: list[int]  # host copies, so no layer ever syncs with the device
    seq_lens_host: list[int]
    groups: dict[str, BlockTables]  # by layer group: "sliding", "full"

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_host)

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens_host, default=0)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens_host, default=0)

    @property
    def is_decode_only(self) -> bool:
        return all(q == 1 for q in self.query_lens_host)
