"""ModelRunner: one scheduled batch -> tensors -> model.forward -> logits of the rows to sample.

It knows tensors and nothing of requests: the engine hands it `BatchEntry`s (token ids, first
position, block tables, whether to sample) built from the scheduler's plain-Python output.
All metadata is built once per step on the host (numpy: at batch 256 the host's work rivals the
GPU's) and copied in one go, so no layer syncs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from osserve.engine.core.kv_cache import BlockCopy
from osserve.engine.worker.cuda_graphs import DecodeGraphs, block_table_array, flat_tokens, slot_mapping
from osserve.engine.worker.kv_tensors import layer_groups
from osserve.engine.worker.mixed_graphs import MixedGraphs
from osserve.engine.worker.verify_graphs import VerifyGraphs, verify_layout
from osserve.model.gpt_oss import GptOssForCausalLM, KVCache
from osserve.ops.attention.metadata import AttentionMetadata, BlockTables, TreeMask
from osserve.ops.policy import KernelPolicy, detect, use_policy


@dataclass(slots=True)
class BatchEntry:
    """One sequence's part of a step: `token_ids` at positions start_pos, start_pos+1, ..."""

    token_ids: list[int]
    start_pos: int
    block_tables: dict[str, list[int]]  # by layer group; -1 where a block was freed
    sample: bool  # the last row's logits are wanted (this chunk reaches the sequence's end)
    # Async scheduling: the last token is still on the device, row `prev_row` of the previous
    # step's sampled ids (token_ids holds PENDING_TOKEN there); -1 when every token is known.
    prev_row: int = -1
    # Speculative decoding: the last num_drafts tokens are drafts, whose logits are wanted too.
    num_drafts: int = 0
    # A draft tree's (speculative/tree.py): each draft's depth (its RoPE position is the root's plus
    # it) and each token's TreeMask bits, root first. None: a chain, plain causal.
    draft_depths: list[int] | None = None
    tree_bits: list[int] | None = None


@dataclass
class StepLogits:
    """What a step leaves for the sampler."""

    # [S, vocab] for the entries with sample=True, in their order: float32, or the model's dtype where
    # the head's GEMM wrote them so (GptOssForCausalLM.compute_logits_and_greedy; the sampler widens)
    logits: torch.Tensor
    greedy: torch.Tensor | None  # [S] int64 their argmax where it came with them (compute_logits_and_greedy)
    greedy_host: torch.Tensor | None = None  # the same ids in pinned host memory, written by the step itself
    aux_hidden: torch.Tensor | None = None  # [T, k * hidden] the captured layers' outputs, every row (EAGLE3)
    hidden: torch.Tensor | None = None  # [T, hidden] the final norm's rows, every row (speculative steps)
    entry_rows: list[int] | None = None  # each entry's first row in hidden / aux_hidden (None: packed in order)


@dataclass
class ModelInput:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    meta: AttentionMetadata
    sample_rows: torch.Tensor  # [S] rows of the flat batch whose logits are wanted


class ModelRunner:
    def __init__(
        self, model: GptOssForCausalLM, kv_caches: list[KVCache], block_size: int,
        device: torch.device, head: bool = True, policy: KernelPolicy | None = None,
    ) -> None:
        """head: compute the logits of the rows to sample. False on the ranks other than 0 of a
        model split over several (distributed/worker.py): their steps end at the hidden states,
        and `run` returns no logits."""
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        self.head = head
        # The kernels every call into the model launches (ops/policy.py; decided at load).
        self.policy = policy if policy is not None else detect(device)
        self.pin = device.type == "cuda"
        self.graphs: DecodeGraphs | None = None
        self.mixed: MixedGraphs | None = None
        # KV caches beside the model's, on a group's block tables: the EAGLE3 draft's (full group).
        self.extra_caches: dict[str, list[KVCache]] = {}
        self.verify_graphs: VerifyGraphs | None = None  # speculative steps' forward (verify_graphs.py)

    def capture_decode_graphs(self, groups: list[str], max_model_len: int, max_batch: int,
                              mixed: bool = True) -> None:
        """Record decode steps (and, with `mixed`, steps of new prompts beside decodes) as CUDA
        graphs (the runner, not the model, decides this)."""
        with use_policy(self.policy):
            self.graphs = DecodeGraphs(self.model, self.kv_caches, groups, self.block_size, max_model_len, max_batch,
                                       head=self.head)
            self.graphs.capture()
            if mixed:
                self.mixed = MixedGraphs(self.model, self.kv_caches, groups, self.block_size, max_model_len,
                                         max_batch)
                self.mixed.capture(self.graphs.pool)

    def _to_device(self, data: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(data)
        return (t.pin_memory() if self.pin else t).to(self.device, non_blocking=True)

    def prepare(self, entries: list[BatchEntry], speculative: bool = False) -> ModelInput:
        ids, pos, query_lens, seq_lens = flat_tokens([e.token_ids for e in entries], [e.start_pos for e in entries])
        starts = np.zeros(len(entries) + 1, dtype=np.int32)
        np.cumsum(query_lens, out=starts[1:])
        rope_pos, tree = pos, None
        if speculative and any(e.tree_bits is not None for e in entries):
            rope_pos, tree = self._tree_mask(entries, pos, starts, seq_lens)
        tables: dict[str, BlockTables] = {}
        seq_of_token = np.repeat(np.arange(len(entries)), query_lens)
        for g in entries[0].block_tables if entries else []:
            rows = block_table_array([e.block_tables[g] for e in entries], len(entries))
            slots = slot_mapping(rows, seq_of_token, pos, self.block_size)
            tables[g] = BlockTables(block_tables=self._to_device(rows), slot_mapping=self._to_device(slots))
        meta = AttentionMetadata(
            query_start_loc=self._to_device(starts),
            seq_lens=self._to_device(np.asarray(seq_lens, dtype=np.int32)),
            query_lens_host=query_lens,
            seq_lens_host=seq_lens,
            groups=tables,
            tree=tree,
        )
        return ModelInput(input_ids=self._to_device(ids), positions=self._to_device(rope_pos), meta=meta,
                          sample_rows=self._to_device(sample_rows(entries, query_lens, speculative)))

    def _tree_mask(self, entries: list[BatchEntry], pos: np.ndarray, starts: np.ndarray, seq_lens: list[int],
                   ) -> tuple[np.ndarray, TreeMask]:
        """Draft trees' RoPE positions (the root's plus each node's depth; slots keep the cache
        positions) and their TreeMask; other rows see as plain causal rows do."""
        rope = pos.copy()
        bits = np.full(len(pos), -1, dtype=np.int64)
        tree_start = np.asarray(seq_lens, dtype=np.int32)
        for b, e in enumerate(entries):
            if e.tree_bits is None or e.draft_depths is None:
                continue
            end = int(starts[b + 1])
            root = end - e.num_drafts - 1
            rope[root + 1:end] = pos[root] + np.asarray(e.draft_depths, dtype=np.int64)
            bits[root:end] = e.tree_bits
            tree_start[b] = pos[root]
        tree = TreeMask(self._to_device(bits), self._to_device(rope), self._to_device(tree_start))
        return rope, tree

    def fill_pending(self, input_ids: torch.Tensor, entries: list[BatchEntry], prev_tokens: torch.Tensor | None,
                     ) -> None:
        """Write the tokens still on the device (async scheduling) into input_ids, in place: the
        last row of each entry with prev_row >= 0 takes prev_tokens[prev_row]. No host sync."""
        if prev_tokens is None:
            return
        n = len(entries)
        prev_rows = np.fromiter((e.prev_row for e in entries), dtype=np.int64, count=n)
        pending = np.flatnonzero(prev_rows >= 0)
        if not len(pending):
            return
        ends = np.cumsum(np.fromiter((len(e.token_ids) for e in entries), dtype=np.int64, count=n)) - 1
        rows, prev = ends[pending], prev_rows[pending]
        p = len(pending)
        if rows[-1] == p - 1 and np.array_equal(rows, prev):  # rows rise strictly: rows == 0..P-1
            # Rows 0..P-1 take prev_tokens[0..P-1] (steady decode: the same batch as the step before):
            # one device copy, instead of an index upload, a gather and a scatter.
            input_ids[:p].copy_(prev_tokens[:p])
            return
        index = self._to_device(np.stack([rows, prev]))  # [2, P]: (flat row, prev row)
        input_ids.index_copy_(0, index[0], prev_tokens[index[1]].to(input_ids.dtype))

    def copy_blocks(self, copies: list[BlockCopy]) -> None:
        """Each copy's source block into its destination, k and v (FP8: codes and scales), in every
        layer of its group."""
        for group, layers in layer_groups(self.model.config).items():
            pairs = [(c.src, c.dst) for c in copies if c.group == group]
            if not pairs:
                continue
            src, dst = self._to_device(np.asarray(pairs, dtype=np.int64).T.copy())
            for kv in [self.kv_caches[layer] for layer in layers] + self.extra_caches.get(group, []):
                for cache in kv.tensors():
                    cache.index_copy_(0, dst, cache.index_select(0, src))

    @torch.inference_mode()
    def run(self, entries: list[BatchEntry], prev_tokens: torch.Tensor | None = None,
            copies: list[BlockCopy] | None = None, speculative: bool = False,
            capture: tuple[int, ...] = ()) -> StepLogits:
        """The logits of the entries with sample=True, and their greedy ids where they came with
        them. prev_tokens: the previous step's sampled ids, on the device (see BatchEntry.prev_row).
        copies: KV blocks to copy first (newcomers' cached last blocks, kv_cache.py). speculative:
        a step of speculative decoding (drafts to verify, `capture`d layers' outputs to keep)."""
        with use_policy(self.policy):
            return self._run(entries, prev_tokens, copies, speculative, capture)

    def _run(self, entries: list[BatchEntry], prev_tokens: torch.Tensor | None, copies: list[BlockCopy] | None,
             speculative: bool, capture: tuple[int, ...]) -> StepLogits:
        if copies:
            self.copy_blocks(copies)
        if speculative:
            return self._run_speculative(entries, capture)
        if self.graphs is not None and self.graphs.can_run(len(entries)) and all(
            len(e.token_ids) == 1 and e.sample for e in entries
        ):
            in_graph = self.graphs.holds(prev_tokens)  # the graph reads the pending tokens itself
            out = self.graphs.run(
                [e.token_ids[0] for e in entries], [e.start_pos for e in entries],
                [e.start_pos + 1 for e in entries],
                {g: [e.block_tables[g] for e in entries] for g in entries[0].block_tables},
                fill_pending=None if in_graph else lambda ids: self.fill_pending(ids, entries, prev_tokens),
                pending_rows=np.fromiter((e.prev_row for e in entries), dtype=np.int64, count=len(entries))
                if in_graph else None,
            )
            if out.logits is not None:  # the graph took the head
                return StepLogits(out.logits, out.greedy, out.greedy_host)
            return self._logits(out.hidden)
        if self.mixed is not None:
            query_lens = [len(e.token_ids) for e in entries]
            shape = self.mixed.shape_for(query_lens)
            if shape is not None:
                hidden = self.mixed.run(
                    [e.token_ids for e in entries], [e.start_pos for e in entries],
                    {g: [e.block_tables[g] for e in entries] for g in entries[0].block_tables}, shape,
                    fill_pending=lambda ids: self.fill_pending(ids, entries, prev_tokens),
                )
                if not self.head:
                    return self._logits(hidden)
                return self._logits(hidden[self._to_device(sample_rows(entries, query_lens))])
        inp = self.prepare(entries)
        self.fill_pending(inp.input_ids, entries, prev_tokens)
        hidden = self.model(inp.input_ids, inp.positions, inp.meta, self.kv_caches)
        return self._logits(hidden[inp.sample_rows])

    def _logits(self, rows: torch.Tensor) -> StepLogits:
        """The logits of the hidden rows to sample (none where this runner has no head)."""
        if not self.head:
            return StepLogits(rows[:0], None)
        return StepLogits(*self.model.compute_logits_and_greedy(rows))


    def _run_speculative(self, entries: list[BatchEntry], capture: tuple[int, ...]) -> StepLogits:
        """A step with drafts to verify or the draft model to feed: every row of a verified chunk
        sampled, the captured layers' outputs kept; a CUDA graph where every request is at its last
        token (verify_graphs.py), else eager."""
        graphs = self.verify_graphs
        size = graphs.size_for(len(entries)) if graphs is not None else None
        if graphs is not None and size is not None and all(
                e.sample and e.prev_row < 0 and len(e.token_ids) == 1 + e.num_drafts <= graphs.q for e in entries):
            layout = verify_layout([e.token_ids for e in entries], [e.start_pos for e in entries],
                                   [e.draft_depths for e in entries], [e.tree_bits for e in entries], graphs.q, size)
            hidden, aux = graphs.run(layout, {g: [e.block_tables[g] for e in entries] for g in graphs.groups})
            rows = np.flatnonzero(layout.real)  # real rows in entry order: every one is sampled
            return StepLogits(self.model.compute_logits(hidden[self._to_device(rows)]), None, aux_hidden=aux,
                              hidden=hidden, entry_rows=layout.entry_rows)
        inp = self.prepare(entries, speculative=True)
        if capture:
            hidden, aux = self.model.forward_capturing(inp.input_ids, inp.positions, inp.meta, self.kv_caches,
                                                       capture)
        else:
            hidden, aux = self.model(inp.input_ids, inp.positions, inp.meta, self.kv_caches), None
        return StepLogits(self.model.compute_logits(hidden[inp.sample_rows]), None, aux_hidden=aux, hidden=hidden)

    def move_kv(self, moves: list[tuple[dict[str, list[int]], int, int]]) -> None:
        """KV of (block tables, from position, to position), in every layer (FP8: codes and scales):
        a draft tree's accepted nodes to the positions after their root (speculative decoding)."""
        if not moves:
            return
        for group, layers in layer_groups(self.model.config).items():
            bs = self.block_size
            src = [t[group][a // bs] * bs + a % bs for t, a, _ in moves]
            dst = [t[group][b // bs] * bs + b % bs for t, _, b in moves]
            index = self._to_device(np.asarray([src, dst], dtype=np.int64))
            for layer in layers:
                for cache in self.kv_caches[layer].tensors():
                    flat = cache.view(-1, *cache.shape[2:])
                    flat.index_copy_(0, index[1], flat.index_select(0, index[0]))


def sample_rows(entries: list[BatchEntry], query_lens: list[int], speculative: bool = False) -> np.ndarray:
    """int64 rows of the flat batch whose logits are wanted: each sampling entry's last token, and
    (speculative) the drafts before it where it verifies some."""
    ends = np.cumsum(query_lens, dtype=np.int64) - 1
    if not speculative:
        return ends[np.fromiter((e.sample for e in entries), dtype=bool, count=len(entries))]
    parts = [np.arange(end - e.num_drafts, end + 1, dtype=np.int64)
             for e, end in zip(entries, ends.tolist(), strict=True) if e.sample]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
