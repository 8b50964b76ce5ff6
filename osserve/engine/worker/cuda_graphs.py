"""CUDA graphs for decode steps: the whole forward of a decode batch replayed as one graph.

A decode step launches hundreds of small kernels (24-36 layers of norms, GEMMs, attention, MoE);
replaying a captured graph removes the launch gaps. Graphs are captured once per batch size in
`sizes` (a batch is padded up to the next size), reading every input from persistent buffers
that each step overwrites: the block tables, and the small inputs staged in one device buffer
(engine/worker/staged_inputs.py). Padded rows write no KV (slot -1) and attend to nothing (length 0).
Up to HEAD_MAX_BATCH the graph also takes the logits head (ops/linear/head_triton.py), whose greedy ids
land in one buffer shared by every size, `sampled`. A step after such a step reads its pending
tokens (async scheduling) from there inside the graph, in the embedding's gather (ops/norm/reference.py,
PendingTokens): an 8-byte device copy before the replay cost the batch-1 step ~24 µs on an H100
(benchmarks/diag/step_overhead.py). The head also writes the ids into a row of a pinned host ring,
`sampled_host`, so the engine needs no copy to the host after the step. Two rows, taken in turn
by the graph steps: the engine reads a step's ids before it launches the step after the next, so
the row a step writes has always been read.
Attention is captured with the longest context as its bound (the split-KV kernel reads each
sequence's real length on the device), so one graph serves every context length.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from itertools import chain
from typing import Any, TypeVar

import numpy as np
import torch

from osserve.engine.worker.staged_inputs import StagedInputs
from osserve.model.gpt_oss import GptOssForCausalLM, KVCache
from osserve.ops.attention.metadata import AttentionMetadata, BlockTables
from osserve.ops.norm.reference import PendingTokens

log = logging.getLogger("osserve")
T = TypeVar("T")

# Up to the largest --max-num-seqs a server is run with (512: the 120b on an H200). A batch above the
# largest captured size runs eagerly, its kernels with gaps between their launches: the 120b's decodes
# of ~480 rows (c=512 on an H200) made 6,304 out tok/s eagerly, 7,773 replayed (BENCHMARKS.md).
DEFAULT_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448, 480, 512)
# Batch sizes whose graphs also take the logits projection and its greedy argmax (ops/linear/head_triton.py):
# the projection then launches with PDL behind the final norm instead of after the graph, and the
# float32 cast and argmax launches go. Bounded by the fused kernel's rows (linear_triton.MAX_TOKENS)
# and by the logits each captured size keeps in the pool (sizes 1-32: 87 rows x 804 KB, 70 MB).
HEAD_MAX_BATCH = 32


@dataclass
class StepOutputs:
    """What a graph's replay leaves in its output buffers (valid until the next replay of it)."""

    hidden: torch.Tensor  # [B, hidden] the final norm's rows
    logits: torch.Tensor | None = None  # [B, vocab] float32, where the graph takes the head
    greedy: torch.Tensor | None = None  # [B] int64 their argmax, likewise
    greedy_host: torch.Tensor | None = None  # the same ids in pinned host memory, once the step is done

    def rows(self, n: int) -> StepOutputs:
        return StepOutputs(self.hidden[:n], None if self.logits is None else self.logits[:n],
                           None if self.greedy is None else self.greedy[:n],
                           None if self.greedy_host is None else self.greedy_host[:n])


class DecodeGraphs:
    def __init__(self, model: GptOssForCausalLM, kv_caches: list[KVCache], groups: list[str],
                 block_size: int, max_model_len: int, max_batch: int, head: bool = True) -> None:
        """head: graphs up to HEAD_MAX_BATCH take the logits head (False: a rank other than 0 of a
        model split over several, which computes no logits; `sampled` then receives the last
        step's ids by a broadcast from rank 0 before the replay, distributed/worker.py)."""
        self.model, self.kv_caches, self.groups = model, kv_caches, groups
        self.head = head
        self.block_size, self.max_model_len = block_size, max_model_len
        self.sizes = [s for s in DEFAULT_SIZES if s <= max_batch] or [1]
        n, dev = self.sizes[-1], next(model.parameters()).device
        width = math.ceil(max_model_len / block_size)
        self.staged = StagedInputs(n, groups, dev)  # ids, positions, slots, lengths: one copy a step
        self.input_ids, self.positions = self.staged.input_ids, self.staged.positions
        self.sampled = torch.zeros(n, dtype=torch.int64, device=dev)  # the head's greedy ids, any size
        self.sampled_host = torch.zeros(2, n, dtype=torch.int64, pin_memory=dev.type == "cuda")  # and on the host
        self.host_turn = 0
        self.seq_lens, self.slots = self.staged.seq_lens, self.staged.slots
        self.query_start_loc = torch.arange(n + 1, dtype=torch.int32, device=dev)
        self.tables = {g: BlockTableBuffer(n, width, dev) for g in groups}
        self.table_rows = {g: BlockTableRows() for g in groups}  # the host arrays, built incrementally
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, StepOutputs] = {}
        self.pool: Any = None

    def _meta(self, b: int) -> AttentionMetadata:
        return AttentionMetadata(
            query_start_loc=self.query_start_loc[: b + 1], seq_lens=self.seq_lens[:b],
            query_lens_host=[1] * b, seq_lens_host=[self.max_model_len] * b,
            groups={g: BlockTables(self.tables[g].tensor[:b], self.slots[g][:b]) for g in self.groups},
        )

    @torch.inference_mode()
    def capture(self) -> None:
        pool = None
        for b in reversed(self.sizes):
            self.graphs[b], self.outputs[b] = capture_graph(partial(self._step, b), pool)
            pool = self.graphs[b].pool() if pool is None else pool
        self.pool = pool  # the mixed-step graphs (engine/worker/mixed_graphs.py) share it
        log.info("captured decode CUDA graphs for batch sizes %s", self.sizes)

    def _step(self, b: int) -> StepOutputs:
        pending = PendingTokens(self.staged.pending_rows[:b], self.sampled)
        hidden = self.model(self.input_ids[:b], self.positions[:b], self._meta(b), self.kv_caches, pending)
        if b > HEAD_MAX_BATCH or not self.head:
            return StepOutputs(hidden)
        from osserve.ops.linear.head_triton import HostIds  # Triton only where graphs are captured (CUDA)

        host = HostIds(self.sampled_host, self.staged.host_slot)
        return StepOutputs(hidden, *self.model.compute_logits_and_greedy(hidden, self.sampled[:b], host))

    def can_run(self, batch: int) -> bool:
        return bool(self.graphs) and batch <= self.sizes[-1]

    def holds(self, prev_tokens: torch.Tensor | None) -> bool:
        """Whether prev_tokens (the last step's sampled ids) are the head's, in `sampled`: a graph
        then reads the pending tokens itself (run's pending_rows)."""
        return prev_tokens is not None and prev_tokens.data_ptr() == self.sampled.data_ptr()

    def run(self, input_ids: list[int], positions: list[int], seq_lens: list[int],
            tables: dict[str, list[list[int]]],
            fill_pending: Callable[[torch.Tensor], None] | None = None,
            pending_rows: np.ndarray | None = None) -> StepOutputs:
        """The outputs of one decode step, [len(input_ids)] rows. The tokens still on the device
        (async scheduling) come either from pending_rows (each row's row of `sampled`, -1 where
        input_ids has the id; only where holds(the last step's ids)) or from fill_pending(ids),
        which writes them into the step's input ids."""
        n = len(input_ids)
        b = self.sizes[bisect.bisect_left(self.sizes, n)]
        # Host-side work is the step's budget at large batches: build with numpy, copy once.
        pos = np.asarray(positions, dtype=np.int64)
        rows = {g: self.table_rows[g].rows(tables[g], b) for g in self.groups}
        turn = self.host_turn
        self.staged.send(b, input_ids, pos, seq_lens,
                         {g: slot_mapping(rows[g][:n], np.arange(n), pos, self.block_size) for g in self.groups},
                         pending_rows, turn)
        if fill_pending is not None:
            fill_pending(self.input_ids[:n])
        for g in self.groups:
            self.tables[g].write(rows[g])
        self.graphs[b].replay()
        out = self.outputs[b]
        if out.greedy is None:
            return out.rows(n)
        self.host_turn = 1 - turn
        return replace(out, greedy_host=self.sampled_host[turn]).rows(n)


def capture_graph(forward: Callable[[], T], pool: Any) -> tuple[torch.cuda.CUDAGraph, T]:
    """(graph, its output): `forward` run twice (to compile the Triton kernels and settle the
    allocator), then captured into the memory pool `pool` (None: a new one)."""
    for _ in range(2):
        forward()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = forward()
    return graph, out


def copy_in(dst: torch.Tensor, values: np.ndarray) -> None:
    """dst[:len(values)] = values without waiting for the device. Pinned on a GPU: a copy from
    pageable memory would make the host wait for the GPU's queue. CPU buffers (the host-only
    profile) take the array as it is."""
    host = torch.from_numpy(values)
    dst[: len(values)].copy_(host.pin_memory() if dst.is_cuda else host, non_blocking=True)


class BlockTableBuffer:
    """A graph's block-table input [rows, max blocks] int32, -1 where no block. Each step writes
    its rows at their own width; the columns past it are reset to -1 only where an earlier, wider
    step wrote them (at batch-1 decode the width only grows: no fill launch a step)."""

    def __init__(self, rows: int, width: int, device: torch.device) -> None:
        self.tensor = torch.full((rows, width), -1, dtype=torch.int32, device=device)
        self.written = np.zeros(rows, dtype=np.int64)  # columns of each row that may hold entries
        self.last: np.ndarray | None = None  # the rows of the last write

    def write(self, rows: np.ndarray) -> None:
        """rows [n, width] (block_table_array) into the first n rows, -1 past width. Rows equal to
        the last write's are not copied again (at batch-1 decode: 15 steps in 16)."""
        if self.last is rows or self.last is not None and self.last.shape == rows.shape and np.array_equal(
                self.last, rows):
            return
        self.last = rows
        n, width = rows.shape
        copy_in(self.tensor[:, :width], rows)
        stale = int(self.written[:n].max(initial=0))
        if stale > width:
            self.tensor[:n, width:stale].fill_(-1)
        self.written[:n] = width


def flat_tokens(token_ids: list[list[int]], start_pos: list[int],
                ) -> tuple[np.ndarray, np.ndarray, list[int], list[int]]:
    """Sequences' new tokens as one flat batch: (ids int64, their positions int64, query lengths,
    sequence lengths after the step)."""
    query_lens = [len(x) for x in token_ids]
    seq_lens = [s + n for s, n in zip(start_pos, query_lens, strict=True)]
    ids = np.fromiter((tok for x in token_ids for tok in x), dtype=np.int64, count=sum(query_lens))
    pos = np.concatenate([np.arange(s, e, dtype=np.int64) for s, e in zip(start_pos, seq_lens, strict=True)])
    return ids, pos, query_lens, seq_lens


def slot_mapping(rows: np.ndarray, seq_of_token: np.ndarray, pos: np.ndarray, block_size: int) -> np.ndarray:
    """Each token's KV slot: its sequence's block for its position (rows from block_table_array)."""
    return rows[seq_of_token, pos // block_size].astype(np.int64) * block_size + pos % block_size


def bounded_slot_mapping(rows: np.ndarray, seq_of_token: np.ndarray, pos: np.ndarray, block_size: int) -> np.ndarray:
    """slot_mapping where a position may lie past its sequence's blocks: -1 there (no write).
    Speculative steps pad requests to a fixed number of rows (verify_graphs.py)."""
    col = pos // block_size
    inside = col < rows.shape[1]
    blocks = np.where(inside, rows[seq_of_token, np.minimum(col, rows.shape[1] - 1)], -1).astype(np.int64)
    return np.where(blocks >= 0, blocks * block_size + pos % block_size, -1)


def block_table_array(tables: list[list[int]], num_rows: int) -> np.ndarray:
    """[num_rows, longest table] int32, each table left-aligned, -1 elsewhere.

    One pass over the ids in C (fromiter over the chained tables, then a masked scatter): a
    Python-level row copy per table cost ~0.6 ms per layer group at batch 229."""
    lengths = np.fromiter(map(len, tables), dtype=np.int64, count=len(tables))
    rows: np.ndarray = np.full((num_rows, int(lengths.max())), -1, dtype=np.int32)
    flat = np.fromiter(chain.from_iterable(tables), dtype=np.int32, count=int(lengths.sum()))
    rows[: len(tables)][np.arange(rows.shape[1]) < lengths[:, None]] = flat
    return rows


class BlockTableRows:
    """block_table_array for decode steps, which mostly repeat the step before's: each row's table
    is compared with a copy of what it was (a list comparison in C, no conversion of its ids), and
    only the rows that changed are written, into a copy of the last array (earlier arrays stay as
    they were: BlockTableBuffer keeps the last one it wrote). At steady decode about one row in 16
    gains a block a step; a batch of other requests, or of the same in another order, or another
    longest table, builds the array anew."""

    def __init__(self) -> None:
        self.tables: list[list[int]] = []  # copies of the tables the array holds, row by row
        self.array: np.ndarray | None = None

    def rows(self, tables: list[list[int]], num_rows: int) -> np.ndarray:
        """block_table_array(tables, num_rows), equal entry by entry (an unchanged batch returns the
        very array of the step before)."""
        array, last = self.array, self.tables
        if array is None or array.shape[0] != num_rows or len(last) != len(tables):
            return self._build(tables, num_rows)
        changed = [i for i, (table, old) in enumerate(zip(tables, last, strict=True)) if table != old]
        if not changed:
            return array
        if len(changed) > len(tables) // 4 or max(map(len, tables)) != array.shape[1]:
            return self._build(tables, num_rows)  # many new rows, or another width
        array = array.copy()
        for i in changed:
            table = tables[i]
            array[i, : len(table)] = table
            array[i, len(table):] = -1
            last[i] = list(table)
        self.array = array
        return array

    def _build(self, tables: list[list[int]], num_rows: int) -> np.ndarray:
        self.tables = [list(t) for t in tables]
        self.array = block_table_array(tables, num_rows)
        return self.array


def padded(values: object, size: int, pad: int, dtype: type) -> np.ndarray:
    """values, then `pad` up to `size` entries."""
    out: np.ndarray = np.full(size, pad, dtype=dtype)
    vals: np.ndarray = np.asarray(values, dtype=dtype)
    out[: len(vals)] = vals
    return out
