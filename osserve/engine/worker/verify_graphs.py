"""CUDA graphs for speculative steps: the target's forward over every request's last token and its
drafts, replayed instead of launched (a step of ~300 kernels from Python cost several times the
decode graph's step).

A speculative step in steady state has every request at its last token with up to Q - 1 drafts
(Q = num_draft_tokens). Graphs are captured for B requests (DEFAULT_SIZES up to the speculation's
batch limit) x Q rows each: request b owns rows b*Q .. b*Q + Q - 1 at cache positions start ..
start + Q - 1; its real rows come first (the root, then its drafts), the rest are padding: id 0,
no KV slot (-1), never seen by a real row (they stand after every real row in cache order) and
never sampled. Trees get their TreeMask (the root's position plus each node's depth for RoPE and
the window); chains need none. Requests past the real batch have length 0 (they attend to
nothing). The captured forward also returns the draft's layers' outputs (forward_capturing), and
the rows' positions in it go back to the engine (StepLogits.entry_rows) for the draft's first pass.

The same code runs without capture (`captured=False`, the CPU tests), so the padded layout is
checked against the plain eager step on any machine.
"""

from __future__ import annotations

import bisect
import logging
import math
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from osserve.engine.worker.cuda_graphs import (
    DEFAULT_SIZES,
    BlockTableBuffer,
    block_table_array,
    bounded_slot_mapping,
    capture_graph,
    copy_in,
)
from osserve.model.gpt_oss import GptOssForCausalLM, KVCache
from osserve.ops.attention.metadata import AttentionMetadata, BlockTables, TreeMask

log = logging.getLogger("osserve")


@dataclass
class VerifyLayout:
    """One step's inputs, padded to a captured size (host arrays)."""

    size: int  # captured batch size
    ids: np.ndarray  # [size * Q] int64
    positions: np.ndarray  # [size * Q] int64 RoPE positions
    cache_positions: np.ndarray  # [size * Q] int64
    seq_lens: np.ndarray  # [size] int32 (0: a padding request)
    bits: np.ndarray  # [size * Q] int64 TreeMask bits (trees only)
    starts: np.ndarray  # [size] int32 TreeMask start
    real: np.ndarray  # [size * Q] bool: rows that are not padding
    entry_rows: list[int]  # each entry's first row


def verify_layout(token_ids: list[list[int]], starts: list[int], depths: list[list[int] | None],
                  bits: list[list[int] | None], q: int, size: int) -> VerifyLayout:
    """token_ids[e]: entry e's root and drafts (at most q); depths / bits: a tree's (None: a chain)."""
    n = size * q
    ids = np.zeros(n, dtype=np.int64)
    cache = np.zeros(n, dtype=np.int64)
    positions = np.zeros(n, dtype=np.int64)
    tree_bits = np.full(n, -1, dtype=np.int64)
    real = np.zeros(n, dtype=bool)
    seq_lens = np.zeros(size, dtype=np.int32)
    tree_start = np.zeros(size, dtype=np.int32)
    for e, (toks, start, d, b) in enumerate(zip(token_ids, starts, depths, bits, strict=True)):
        lo = e * q
        m = len(toks)
        assert m <= q
        ids[lo: lo + m] = toks
        cache[lo: lo + q] = np.arange(start, start + q)
        positions[lo: lo + q] = cache[lo: lo + q]
        if d is not None and b is not None:
            positions[lo + 1: lo + m] = start + np.asarray(d, dtype=np.int64)
            tree_bits[lo: lo + m] = b
        real[lo: lo + m] = True
        seq_lens[e] = start + q
        tree_start[e] = start
    return VerifyLayout(size, ids, positions, cache, seq_lens, tree_bits, tree_start, real,
                        [e * q for e in range(len(token_ids))])


class VerifyGraphs:
    def __init__(self, model: GptOssForCausalLM, kv_caches: list[KVCache], groups: list[str], block_size: int,
                 max_positions: int, max_batch: int, q: int, tree: bool, capture_layers: tuple[int, ...],
                 captured: bool = True) -> None:
        self.model, self.kv_caches, self.groups = model, kv_caches, groups
        self.block_size, self.q, self.tree, self.capture_layers = block_size, q, tree, capture_layers
        self.captured = captured
        self.sizes = [s for s in DEFAULT_SIZES if s <= max_batch] or [1]
        n, dev = self.sizes[-1], next(model.parameters()).device
        width = math.ceil(max_positions / block_size) + 1
        rows = n * q
        self.input_ids = torch.zeros(rows, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(rows, dtype=torch.int64, device=dev)
        self.slots = {g: torch.full((rows,), -1, dtype=torch.int64, device=dev) for g in groups}
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=dev)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=dev) * q
        self.bits = torch.full((rows,), -1, dtype=torch.int64, device=dev)
        self.tree_start = torch.zeros(n, dtype=torch.int32, device=dev)
        self.tables = {g: BlockTableBuffer(n, width, dev) for g in groups}
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}
        self.max_positions = max_positions

    def _meta(self, b: int, seq_lens: list[int]) -> AttentionMetadata:
        """seq_lens: the host's copy; in a graph only a bound (the kernels read the device's), so the
        longest; run without capture (the reference attention reads it), the real ones."""
        rows = b * self.q
        tree = TreeMask(self.bits[:rows], self.positions[:rows], self.tree_start[:b]) if self.tree else None
        return AttentionMetadata(
            query_start_loc=self.query_start_loc[: b + 1], seq_lens=self.seq_lens[:b],
            query_lens_host=[self.q] * b, seq_lens_host=seq_lens,
            groups={g: BlockTables(self.tables[g].tensor[:b], self.slots[g][:rows]) for g in self.groups}, tree=tree)

    def _forward(self, b: int, seq_lens: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        rows = b * self.q
        meta = self._meta(b, seq_lens if seq_lens is not None else [self.max_positions] * b)
        args = (self.input_ids[:rows], self.positions[:rows], meta, self.kv_caches)
        if self.capture_layers:
            return self.model.forward_capturing(*args, self.capture_layers)
        return self.model(*args), None

    @torch.inference_mode()
    def capture(self, pool: Any = None) -> Any:
        for b in reversed(self.sizes):
            self.graphs[b], self.outputs[b] = capture_graph(partial(self._forward, b), pool)
            pool = self.graphs[b].pool() if pool is None else pool
        log.info("captured speculative verify CUDA graphs: %d rows a request, batch sizes %s", self.q, self.sizes)
        return pool

    def size_for(self, num_entries: int) -> int | None:
        return None if num_entries > self.sizes[-1] else self.sizes[bisect.bisect_left(self.sizes, num_entries)]

    def run(self, layout: VerifyLayout, tables: dict[str, list[list[int]]]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(hidden [size*Q, H], the captured layers' outputs or None), padded rows included."""
        b, rows = layout.size, layout.size * self.q
        copy_in(self.input_ids, layout.ids)
        copy_in(self.positions, layout.positions)
        copy_in(self.seq_lens, layout.seq_lens)
        if self.tree:
            copy_in(self.bits, layout.bits)
            copy_in(self.tree_start, layout.starts)
        real_seqs = len(layout.entry_rows)
        seq_of_row = np.repeat(np.arange(b), self.q)
        for g in self.groups:
            table = block_table_array(tables[g], real_seqs)
            self.tables[g].write(table)
            padded = np.full((b, table.shape[1]), -1, dtype=np.int32)
            padded[:real_seqs] = table
            slot = bounded_slot_mapping(padded, seq_of_row, layout.cache_positions, self.block_size)
            copy_in(self.slots[g], np.where(layout.real, slot, -1))
        if self.captured:
            self.graphs[b].replay()
            hidden, aux = self.outputs[b]
        else:
            hidden, aux = self._forward(b, layout.seq_lens.tolist())
        return hidden[:rows], None if aux is None else aux[:rows]
