"""CUDA graphs for mixed steps: new prompts beside running decodes, replayed instead of launched.

Under load, newcomers join the running batch every few steps. Such a step ran eagerly: ~300
kernel launches from Python (25-48 ms in an earlier measurement, against ~16 ms for a replayed
decode step of the same batch), and 15% of the 20b serving benchmark's steps were such steps;
replaying them cut the engine's build+launch time from 6.7 to 3.6 ms per step on average
(BENCHMARKS.md). Here a step is padded to a captured shape and replayed:

- shapes are keyed by (T, Q): T total tokens (TOKEN_BUCKETS) and Q the longest query (QUERY_
  BUCKETS). The attention prefill kernel's grid is (sequences, ceil(Q / 16), kv heads), so the
  graph is captured with Q as its bound; programs past a sequence's length exit at once. Longer
  prompts (Q > the largest bucket) run eagerly: their step is GPU-bound anyway.
- sequences: the step's own, then padding sequences that hold the padded tokens, at most Q each
  (so the grid covers every row), each of length 0 (they attend to nothing and, with slot -1,
  write no KV), then empty ones up to the captured count.
- every input lives in a persistent buffer that each step overwrites (pinned host copies).
"""

from __future__ import annotations

import bisect
import logging
import math
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import torch

from osserve.engine.worker.cuda_graphs import (
    BlockTableBuffer,
    block_table_array,
    capture_graph,
    copy_in,
    flat_tokens,
    padded,
    slot_mapping,
)
from osserve.model.gpt_oss import GptOssForCausalLM, KVCache
from osserve.ops.attention.metadata import AttentionMetadata, BlockTables

log = logging.getLogger("osserve")

TOKEN_BUCKETS = (128, 256, 384, 512, 768, 1024)
QUERY_BUCKETS = (16, 64, 256)


def sequence_layout(query_lens: list[int], seq_lens: list[int], num_tokens: int, max_query: int,
                    num_seqs: int) -> tuple[np.ndarray, np.ndarray]:
    """(query_start_loc [num_seqs + 1], seq_lens [num_seqs]) int32 for a step padded to num_tokens:
    the real sequences, then padding sequences of at most max_query tokens and length 0 covering
    the padded tokens, then empty ones."""
    real = len(query_lens)
    padding = num_tokens - sum(query_lens)
    chunks = [max_query] * (padding // max_query) + ([padding % max_query] if padding % max_query else [])
    assert real + len(chunks) <= num_seqs and max(query_lens, default=0) <= max_query, \
        (real, len(chunks), num_seqs, max(query_lens, default=0), max_query)
    starts = np.full(num_seqs + 1, num_tokens, dtype=np.int32)
    starts[0] = 0
    np.cumsum(query_lens + chunks, out=starts[1: real + len(chunks) + 1])
    lens = np.zeros(num_seqs, dtype=np.int32)
    lens[:real] = seq_lens
    return starts, lens


class MixedGraphs:
    def __init__(self, model: GptOssForCausalLM, kv_caches: list[KVCache], groups: list[str],
                 block_size: int, max_model_len: int, max_seqs: int) -> None:
        self.model, self.kv_caches, self.groups = model, kv_caches, groups
        self.block_size, self.max_model_len = block_size, max_model_len
        self.keys = [(t, q) for t in TOKEN_BUCKETS for q in QUERY_BUCKETS if q <= t]
        n = TOKEN_BUCKETS[-1]
        # Room for every running sequence plus the padding sequences of the finest query bucket.
        self.num_seqs = max_seqs + math.ceil(n / QUERY_BUCKETS[0])
        dev = next(model.parameters()).device
        width = math.ceil(max_model_len / block_size)
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.query_start_loc = torch.zeros(self.num_seqs + 1, dtype=torch.int32, device=dev)
        self.seq_lens = torch.zeros(self.num_seqs, dtype=torch.int32, device=dev)
        self.tables = {g: BlockTableBuffer(self.num_seqs, width, dev) for g in groups}
        self.slots = {g: torch.full((n,), -1, dtype=torch.int64, device=dev) for g in groups}
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}

    def _meta(self, t: int, q: int) -> AttentionMetadata:
        # Only the bounds matter on the GPU: max_query_len sizes the prefill kernel's grid. The
        # replayed steps mix decodes with prompt chunks: attention tells them apart on the device.
        return AttentionMetadata(
            query_start_loc=self.query_start_loc, seq_lens=self.seq_lens,
            query_lens_host=[q], seq_lens_host=[self.max_model_len],
            groups={g: BlockTables(self.tables[g].tensor, self.slots[g][:t]) for g in self.groups},
            replays_mixed=True,
        )

    @torch.inference_mode()
    def capture(self, pool: Any = None) -> None:
        """Capture every (T, Q) shape into `pool` (the decode graphs' memory pool)."""
        for t, q in reversed(self.keys):
            starts, lens = sequence_layout([], [], t, q, self.num_seqs)  # padding only: every row valid
            self.query_start_loc.copy_(torch.from_numpy(starts))
            self.seq_lens.copy_(torch.from_numpy(lens))
            meta = self._meta(t, q)
            self.graphs[(t, q)], self.outputs[(t, q)] = capture_graph(
                partial(self.model, self.input_ids[:t], self.positions[:t], meta, self.kv_caches), pool)
            pool = self.graphs[(t, q)].pool() if pool is None else pool
        log.info("captured mixed-step CUDA graphs for (tokens, longest query) %s", self.keys)

    def shape_for(self, query_lens: list[int]) -> tuple[int, int] | None:
        """The captured (T, Q) a step with these query lengths replays in, or None (run eagerly)."""
        total, longest = sum(query_lens), max(query_lens)
        if total > TOKEN_BUCKETS[-1] or longest > QUERY_BUCKETS[-1]:
            return None
        q = QUERY_BUCKETS[bisect.bisect_left(QUERY_BUCKETS, longest)]
        t = TOKEN_BUCKETS[bisect.bisect_left(TOKEN_BUCKETS, max(total, q))]
        padding_seqs = math.ceil((t - total) / q)
        return (t, q) if len(query_lens) + padding_seqs <= self.num_seqs else None

    def run(self, token_ids: list[list[int]], start_pos: list[int], tables: dict[str, list[list[int]]],
            shape: tuple[int, int], fill_pending: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
        """Hidden states [T, hidden] of the step (rows past the real tokens are padding).
        fill_pending(ids) writes the tokens still on the device into the real input ids."""
        t, q = shape
        ids, pos, query_lens, seq_lens = flat_tokens(token_ids, start_pos)
        n = len(ids)
        starts, lens = sequence_layout(query_lens, seq_lens, t, q, self.num_seqs)

        copy_in(self.input_ids, padded(ids, t, 0, np.int64))
        if fill_pending is not None:
            fill_pending(self.input_ids[:n])
        copy_in(self.positions, padded(pos, t, 0, np.int64))
        copy_in(self.query_start_loc, starts)
        copy_in(self.seq_lens, lens)
        seq_of_token = np.repeat(np.arange(len(query_lens)), query_lens)
        for g in self.groups:
            rows = block_table_array(tables[g], len(query_lens))
            copy_in(self.slots[g], padded(slot_mapping(rows, seq_of_token, pos, self.block_size), t, -1, np.int64))
            self.tables[g].write(rows)
        self.graphs[shape].replay()
        return self.outputs[shape]
