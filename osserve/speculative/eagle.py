"""EAGLE3 proposals: the draft model's passes after each target step, and the trees they grow.

First pass: one row per position whose target states are now known (a prompt chunk's rows, or the
root and the accepted drafts of a verified step), holding the token after that position. It
writes the draft's KV for those positions (overwriting any guessed ones) and its last row's logits
give the first draft tokens. Then num_speculative_tokens - 1 expansion passes:
- topk 1 (a chain): one row a request, the last guess and the draft's own state, at the next
  position: a decode step over the draft's cache.
- topk K (a tree, EAGLE-2's beam search as SGLang runs it): K beams a request; each pass runs the
  beams, every beam proposes its K best children scored by cumulative log-probability, and the K
  best of those K x K become the next beams. The beams of one pass stand at one real position but
  K distinct cache positions after the request's verified ones; each sees the committed cache and
  its own ancestors only (a TreeMask starting at the first expansion row). All candidates are kept,
  and the num_draft_tokens - 1 best that form a tree are verified (tree.select_tree).
The expansion rows' cache slots lie past the step's verified tokens: the scheduler gives each
speculating request SpeculativeConfig.lookahead_slots more for them, and the next first pass
overwrites whichever become real positions. The draft reads its cache through the target's
full-attention block tables (same positions, same blocks; a KV tensor of its own).

One host sync a step: the proposals, at the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from osserve.engine.worker.cuda_graphs import block_table_array, bounded_slot_mapping, flat_tokens
from osserve.model.eagle3 import Eagle3Draft
from osserve.model.gpt_oss import FULL_GROUP, KVCache
from osserve.ops.attention.metadata import AttentionMetadata, BlockTables, TreeMask
from osserve.speculative.config import SpeculativeConfig
from osserve.speculative.tree import DraftTree, select_tree


@dataclass
class DraftInput:
    """One request's share of the draft's first pass."""

    rows: list[int]  # its rows of the step's flat batch with known target states, in position order
    start: int  # the position of the first of them
    next_tokens: list[int]  # the token after each row's position (the last: the one just sampled)
    block_table: list[int]  # the request's full-attention block table
    depth: int  # draft tokens wanted after the last row (0: none, e.g. a prompt chunk)


@dataclass
class DraftPass:
    """One expansion pass's inputs on the device: RoPE positions [R] and the metadata over the
    draft's cache (for trees, its TreeMask's bits are written by the pass itself)."""

    positions: torch.Tensor
    meta: AttentionMetadata


class Eagle3Proposer:
    def __init__(self, draft: Eagle3Draft, kv_cache: KVCache, block_size: int, config: SpeculativeConfig,
                 device: torch.device) -> None:
        self.draft, self.kv_cache, self.block_size = draft, kv_cache, block_size
        self.steps, self.topk, self.tree_size = config.num_speculative_tokens, config.topk, config.num_draft_tokens - 1
        self.device = device
        self.graphs: DraftGraphsLike | None = None  # speculative/eagle_graphs.py, on a GPU

    @property
    def capture_layers(self) -> tuple[int, ...]:
        return self.draft.config.aux_layer_ids

    def _to_device(self, a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(a)
        return (t.pin_memory() if self.device.type == "cuda" else t).to(self.device, non_blocking=True)

    def meta(self, query_lens: list[int], cache_pos: np.ndarray, seq_lens: list[int], tables: list[list[int]],
             tree: TreeMask | None = None) -> AttentionMetadata:
        rows = block_table_array(tables, len(tables))
        seq_of_token = np.repeat(np.arange(len(tables)), query_lens)
        starts = np.zeros(len(tables) + 1, dtype=np.int32)
        np.cumsum(query_lens, out=starts[1:])
        slot = bounded_slot_mapping(rows, seq_of_token, cache_pos, self.block_size)
        return AttentionMetadata(
            query_start_loc=self._to_device(starts), seq_lens=self._to_device(np.asarray(seq_lens, dtype=np.int32)),
            query_lens_host=list(query_lens), seq_lens_host=list(seq_lens),
            groups={FULL_GROUP: BlockTables(self._to_device(rows), self._to_device(slot))}, tree=tree)

    @torch.inference_mode()
    def propose(self, aux: torch.Tensor, inputs: list[DraftInput]) -> list[DraftTree | None]:
        """aux [T, 3H]: the step's captured target states. Returns each input's draft (None where
        depth is 0)."""
        if not inputs:
            return []
        if self.graphs is not None and self.graphs.fits(inputs):
            return self.trees(inputs, self.graphs.run(aux, inputs))
        ids, pos, query_lens, seq_lens = flat_tokens([i.next_tokens for i in inputs], [i.start for i in inputs])
        rows = torch.from_numpy(np.fromiter((r for i in inputs for r in i.rows), dtype=np.int64)).to(aux.device)
        meta = self.meta(query_lens, pos, seq_lens, [i.block_table for i in inputs])
        grow = [k for k, i in enumerate(inputs) if i.depth > 0]
        if not grow:
            self.first_pass(aux[rows], self._to_device(ids), self._to_device(pos), meta)
            return [None] * len(inputs)
        last = self._to_device(np.cumsum(query_lens, dtype=np.int64)[grow] - 1)
        p0 = np.asarray([seq_lens[k] - 1 for k in grow], dtype=np.int64)  # the last first-pass position
        normed, hidden = self.first_pass(aux[rows], self._to_device(ids), self._to_device(pos), meta, last)
        passes = self.expansion_passes(p0, [inputs[k].block_table for k in grow])
        out = self.chain(normed, hidden, passes) if self.topk == 1 else self.tree(normed, hidden, passes)
        trees = self.trees([inputs[k] for k in grow], out)
        result: list[DraftTree | None] = [None] * len(inputs)
        for k, tree in zip(grow, trees, strict=True):
            result[k] = tree
        return result

    def first_pass(self, aux_rows: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                   last: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The draft over the rows whose target states are known; (normed, prenorm) of `last` rows."""
        normed, prenorm = self.draft(ids, self.draft.project(aux_rows), positions, meta, self.kv_cache)
        return (normed, prenorm) if last is None else (normed[last], prenorm[last])

    def expansion_passes(self, p0: np.ndarray, tables: list[list[int]]) -> list[DraftPass]:
        """The passes after the first, for requests whose last first-pass row is at p0."""
        b, k = len(tables), self.topk
        passes = []
        base = p0 + 1  # cache position of the first expansion row
        for s in range(1, self.steps):
            if k == 1:  # the row of the depth-s guess, at its own position
                pos = p0 + s
                passes.append(DraftPass(self._to_device(pos), self.meta([1] * b, pos, (pos + 1).tolist(), tables)))
                continue
            cache_pos = (base[:, None] + (s - 1) * k + np.arange(k)[None, :]).reshape(-1)
            real = self._to_device(np.repeat(p0 + s, k))
            tree = TreeMask(torch.zeros(b * k, dtype=torch.int64, device=self.device), real,
                            self._to_device(base.astype(np.int32)))
            passes.append(DraftPass(real, self.meta([k] * b, cache_pos, (base + s * k).tolist(), tables, tree)))
        return passes

    def chain(self, normed: torch.Tensor, hidden: torch.Tensor, passes: list[DraftPass]) -> tuple[torch.Tensor, ...]:
        """(guesses [B, steps] target ids,)"""
        draft = self.draft
        tok = draft.to_target(draft.logits(normed).argmax(-1))
        guesses = [tok]
        for p in passes:
            normed, hidden = draft(tok, hidden, p.positions, p.meta, self.kv_cache)
            tok = draft.to_target(draft.logits(normed).argmax(-1))
            guesses.append(tok)
        return (torch.stack(guesses, dim=1),)

    def tree(self, normed: torch.Tensor, hidden: torch.Tensor, passes: list[DraftPass]) -> tuple[torch.Tensor, ...]:
        """(candidate target ids, their cumulative log-probabilities, their parent candidates), [B, C] each."""
        draft, k = self.draft, self.topk
        b, h = hidden.shape
        dev = hidden.device
        score, ids = draft.logits(normed).log_softmax(-1).topk(k, dim=-1)  # [B, K]
        cand_tokens, cand_scores = [draft.to_target(ids)], [score]
        cand_parents = [torch.full((b, k), -1, dtype=torch.int64, device=dev)]
        beam_cand = torch.arange(k, device=dev).expand(b, k)  # each beam's candidate index
        beam_score, beam_hidden = score, hidden[:, None, :].expand(b, k, h)
        beam_bits = torch.zeros(b, k, dtype=torch.int64, device=dev)  # ancestors among the expansion rows
        n_cands = k
        for s, p in enumerate(passes, start=1):
            j = (s - 1) * k + torch.arange(k, device=dev)  # this pass's expansion row of each beam
            bits = beam_bits | (1 << j)[None, :]
            assert p.meta.tree is not None
            p.meta.tree.bits.copy_(bits.reshape(-1))
            tokens_in = torch.cat(cand_tokens, dim=1).gather(1, beam_cand)
            out_normed, out_hidden = draft(tokens_in.reshape(-1), beam_hidden.reshape(b * k, h), p.positions, p.meta,
                                           self.kv_cache)
            lp = draft.logits(out_normed).log_softmax(-1).view(b, k, -1)
            child_score, child_ids = lp.topk(k, dim=-1)  # [B, K beams, K children]
            child_score = beam_score[..., None] + child_score
            cand_tokens.append(draft.to_target(child_ids).reshape(b, k * k))
            cand_scores.append(child_score.reshape(b, k * k))
            cand_parents.append(beam_cand[..., None].expand(b, k, k).reshape(b, k * k))
            beam_score, pick = child_score.reshape(b, k * k).topk(k, dim=-1)
            parent = pick // k
            beam_cand = n_cands + pick
            n_cands += k * k
            beam_hidden = out_hidden.view(b, k, h).gather(1, parent[..., None].expand(b, k, h))
            beam_bits = bits.gather(1, parent)
        return torch.cat(cand_tokens, dim=1), torch.cat(cand_scores, dim=1).float(), torch.cat(cand_parents, dim=1)

    def trees(self, inputs: list[DraftInput], out: tuple[torch.Tensor, ...]) -> list[DraftTree | None]:
        """chain()'s or tree()'s output (rows for `inputs`, in order) as each input's trimmed draft."""
        host = [t.tolist() for t in out]
        trees: list[DraftTree | None] = []
        for row, inp in enumerate(inputs):
            if inp.depth <= 0:
                trees.append(None)
            elif self.topk == 1:
                trees.append(DraftTree.chain(host[0][row]).trimmed(inp.depth))
            else:
                trees.append(select_tree(host[0][row], host[2][row], host[1][row], self.tree_size).trimmed(inp.depth))
        return trees


class DraftGraphsLike(Protocol):
    def fits(self, inputs: list[DraftInput]) -> bool: ...

    def run(self, aux: torch.Tensor, inputs: list[DraftInput]) -> tuple[torch.Tensor, ...]: ...
