"""What attention needs to know about one batch, built once per step by the runner (engine/worker):
where each sequence's query rows are, how long each sequence is, and each layer group's block
tables and cache slots. Plain dataclasses of tensors and host ints, so no layer syncs the device.

The KV cache of one layer is a pair of tensors [num_blocks, block_size, kv_heads, head_dim].
A sequence's token at position p lives in block `block_table[p // block_size]`, row
`p % block_size`. Sliding-window layers free blocks that fall out of the window, leaving -1 holes
in their block tables: attention never reads positions older than the window, so never a hole.

Speculative decoding verifies a tree of draft tokens in one step (speculative/tree.py): its nodes
stand at consecutive cache positions after the sequence's last token, but a node sees only its
ancestors, and its real position (RoPE, the sliding window) is the root's plus its depth. A
`TreeMask` says so per query row; a chain of drafts needs none (it is plain causal).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass
class BlockTables:
    """The block tables of one layer group (sliding or full) for one batch."""

    block_tables: torch.Tensor  # [B, max_blocks] int32, -1 where a block was freed
    slot_mapping: torch.Tensor  # [T] int64: cache row (block * block_size + offset) per new token


@dataclass
class TreeMask:
    """Which tokens of a draft tree each query row sees (speculative decoding).

    A key at cache position k of sequence b is seen by query row t (at cache position q) when
    k <= q, when k - start[b] is outside [0, 64) or bit k - start[b] of bits[t] is set, and, on a
    sliding-window layer, when positions[t] - k < window. Keys inside a tree are its query's
    ancestors, always within the window (trees are shallower than it), so the window is checked
    against their cache position. Rows of sequences without a tree have bits -1 (every bit)."""

    bits: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64: each row's real position (the root's + its depth)
    start: torch.Tensor  # [B] int32: the cache position of each sequence's bit 0


MAX_TREE_TOKENS = 64  # bits of TreeMask.bits: a tree (root included) spans at most this many positions


@dataclass
class AttentionMetadata:
    """Everything attention needs about one batch; built once per step by the runner."""

    query_start_loc: torch.Tensor  # [B+1] int32, on the model's device
    seq_lens: torch.Tensor  # [B] int32: tokens in the cache after this step, per sequence
    query_lens_host: list[int]  # host copies, so no layer ever syncs with the device
    seq_lens_host: list[int]
    groups: dict[str, BlockTables]  # by layer group: "sliding", "full"
    tree: TreeMask | None = None  # draft trees among the sequences (speculative decoding)
    # A captured mixed-step graph's (engine/worker/mixed_graphs.py): its host lists describe the
    # capture, while the batches it replays mix one-token queries with longer ones on the device.
    replays_mixed: bool = False

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
        return self.tree is None and all(q == 1 for q in self.query_lens_host)

    @functools.cached_property
    def prompt_range(self) -> tuple[int, int] | None:
        """A mixed batch (one-token queries beside longer ones, no tree): the sequences [lo, hi)
        that hold every longer query, for attention to split the batch in two launches
        (paged_triton.paged_attention_triton); else None. A mixed-step graph's: every sequence."""
        if self.tree is not None:
            return None
        if self.replays_mixed:
            return 0, self.seq_lens.shape[0]
        longer = [i for i, q in enumerate(self.query_lens_host) if q > 1]
        if not longer or 1 not in self.query_lens_host:
            return None
        return longer[0], longer[-1] + 1
