"""CUDA graphs for the EAGLE3 draft's passes in steady state (speculative/eagle.py's first pass and
expansions, replayed as one graph per batch size).

After a verified step each request feeds the draft its root and accepted drafts: at most Q rows
(Q = num_draft_tokens), padded to Q like the verify graphs (engine/worker/verify_graphs.py): real
rows first at cache positions start .., padding rows after them with no KV slot, requests past the
real batch of length 0. The rows' target states are gathered into the graph's own input buffer.
Every expansion pass's positions, slots and lengths depend on how many drafts were accepted, so
the host computes them all before the replay and copies them in; a tree's attention bits are
computed by the passes themselves. The outputs (chain guesses, or the tree candidates) come back
in the input's order for `Eagle3Proposer.trees`.

Prompt chunks (more rows than Q) run eagerly. `captured=False` runs the same code without a graph
(the CPU tests).
"""

from __future__ import annotations

import bisect
import logging
import math
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
from osserve.model.gpt_oss import FULL_GROUP
from osserve.ops.attention.metadata import AttentionMetadata, BlockTables, TreeMask
from osserve.speculative.eagle import DraftInput, DraftPass, Eagle3Proposer

log = logging.getLogger("osserve")


class DraftGraphs:
    def __init__(self, proposer: Eagle3Proposer, max_batch: int, q: int, max_positions: int, aux_width: int,
                 dtype: torch.dtype, captured: bool = True) -> None:
        self.proposer, self.q, self.max_positions, self.captured = proposer, q, max_positions, captured
        self.sizes = [s for s in DEFAULT_SIZES if s <= max_batch] or [1]
        self.block_size = proposer.block_size
        n, dev, k = self.sizes[-1], proposer.device, proposer.topk
        steps = proposer.steps - 1
        self.aux = torch.zeros(n * q, aux_width, dtype=dtype, device=dev)
        self.ids = torch.zeros(n * q, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n * q, dtype=torch.int64, device=dev)
        self.slots = torch.full((n * q,), -1, dtype=torch.int64, device=dev)
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=dev)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=dev) * q
        self.last = torch.zeros(n, dtype=torch.int64, device=dev)
        self.table = BlockTableBuffer(n, math.ceil(max_positions / self.block_size) + 1, dev)
        self.x_positions = torch.zeros(max(steps, 1), n * k, dtype=torch.int64, device=dev)
        self.x_slots = torch.full((max(steps, 1), n * k), -1, dtype=torch.int64, device=dev)
        self.x_seq_lens = torch.zeros(max(steps, 1), n, dtype=torch.int32, device=dev)
        self.x_query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=dev) * k
        self.x_bits = torch.zeros(max(steps, 1), n * k, dtype=torch.int64, device=dev)
        self.x_start = torch.zeros(n, dtype=torch.int32, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, tuple[torch.Tensor, ...]] = {}

    def _body(self, b: int, host: tuple[list[int], list[list[int]]] | None = None) -> tuple[torch.Tensor, ...]:
        """host: the sequence lengths of the first pass and of each expansion, the host's copy. In a
        graph only bounds (the kernels read the device's); without capture, the real ones (the
        reference attention reads them)."""
        p, q, k = self.proposer, self.q, self.proposer.topk
        rows = b * q
        table = self.table.tensor[:b]
        bound = [self.max_positions] * b
        first_lens, step_lens = host if host is not None else (bound, [bound] * (p.steps - 1))
        first = AttentionMetadata(self.query_start_loc[: b + 1], self.seq_lens[:b], [q] * b, first_lens,
                                  {FULL_GROUP: BlockTables(table, self.slots[:rows])})
        normed, hidden = p.first_pass(self.aux[:rows], self.ids[:rows], self.positions[:rows], first, self.last[:b])
        passes = []
        for s in range(p.steps - 1):
            tree = TreeMask(self.x_bits[s, : b * k], self.x_positions[s, : b * k], self.x_start[:b]) if k > 1 else None
            meta = AttentionMetadata(self.x_query_start_loc[: b + 1], self.x_seq_lens[s, :b], [k] * b, step_lens[s],
                                     {FULL_GROUP: BlockTables(table, self.x_slots[s, : b * k])}, tree)
            passes.append(DraftPass(self.x_positions[s, : b * k], meta))
        return p.chain(normed, hidden, passes) if k == 1 else p.tree(normed, hidden, passes)

    @torch.inference_mode()
    def capture(self, pool: Any = None) -> Any:
        for b in reversed(self.sizes):
            self.graphs[b], self.outputs[b] = capture_graph(partial(self._body, b), pool)
            pool = self.graphs[b].pool() if pool is None else pool
        log.info("captured EAGLE3 draft CUDA graphs: batch sizes %s", self.sizes)
        return pool

    def fits(self, inputs: list[DraftInput]) -> bool:
        return len(inputs) <= self.sizes[-1] and all(len(i.rows) <= self.q for i in inputs)

    @torch.inference_mode()
    def run(self, aux: torch.Tensor, inputs: list[DraftInput]) -> tuple[torch.Tensor, ...]:
        """The proposals' tensors (chain guesses, or tree candidates), one row per input."""
        n = len(inputs)
        b = self.sizes[bisect.bisect_left(self.sizes, n)]
        q, k, bs = self.q, self.proposer.topk, self.block_size
        steps = self.proposer.steps - 1
        src = np.zeros(b * q, dtype=np.int64)
        ids = np.zeros(b * q, dtype=np.int64)
        cache = np.zeros(b * q, dtype=np.int64)
        real = np.zeros(b * q, dtype=bool)
        seq_lens = np.zeros(b, dtype=np.int32)
        last = np.zeros(b, dtype=np.int64)
        p0 = np.zeros(b, dtype=np.int64)
        for e, inp in enumerate(inputs):
            m, lo = len(inp.rows), e * q
            src[lo: lo + m] = inp.rows
            ids[lo: lo + m] = inp.next_tokens
            cache[lo: lo + q] = np.arange(inp.start, inp.start + q)
            real[lo: lo + m] = True
            seq_lens[e] = inp.start + q
            last[e] = lo + m - 1
            p0[e] = inp.start + m - 1
        tables = block_table_array([i.block_table for i in inputs], b)
        self.table.write(tables[:n])
        seq_of_row = np.repeat(np.arange(b), q)
        torch.index_select(aux, 0, torch.from_numpy(src).to(aux.device), out=self.aux[: b * q])
        copy_in(self.ids, ids)
        copy_in(self.positions, cache)
        copy_in(self.slots, np.where(real, bounded_slot_mapping(tables, seq_of_row, cache, bs), -1))
        copy_in(self.seq_lens, seq_lens)
        copy_in(self.last, last)
        live = np.arange(b) < n
        step_lens: list[list[int]] = []
        if steps:
            s = np.arange(1, steps + 1)[:, None]  # [steps, 1]
            if k == 1:
                pos = p0[None, :] + s  # [steps, b]
                seq = np.where(live, pos + 1, 0)
                rows_of = np.arange(b)
            else:
                base = p0 + 1
                pos = np.repeat(p0[None, :] + s, k, axis=1)  # [steps, b*k]
                first_row = base[None, :, None] + (s[:, :, None] - 1) * k  # [steps, b, 1]
                cache_x = (first_row + np.arange(k)[None, None, :]).reshape(steps, -1)
                seq = np.where(live, base[None, :] + s * k, 0)
                rows_of = np.repeat(np.arange(b), k)
                copy_in(self.x_start, base.astype(np.int32))
            slot_pos = pos if k == 1 else cache_x
            x_slots = np.stack([np.where(np.repeat(live, k), bounded_slot_mapping(tables, rows_of, slot_pos[i], bs), -1)
                                for i in range(steps)])
            for i in range(steps):
                copy_in(self.x_positions[i], pos[i])
                copy_in(self.x_slots[i], x_slots[i])
                copy_in(self.x_seq_lens[i], seq[i].astype(np.int32))
                step_lens.append(seq[i].tolist())
        if self.captured:
            self.graphs[b].replay()
            out = self.outputs[b]
        else:
            out = self._body(b, (seq_lens.tolist(), step_lens))
        return tuple(t[:n] for t in out)
