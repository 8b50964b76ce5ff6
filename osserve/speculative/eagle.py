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

import numpy as np
import torch

from osserve.engine.worker.cuda_graphs import block_table_array, flat_tokens
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


class Eagle3Proposer:
    def __init__(self, draft: Eagle3Draft, kv_cache: KVCache, block_size: int, config: SpeculativeConfig,
                 device: torch.device) -> None:
        self.draft, self.kv_cache, self.block_size = draft, kv_cache, block_size
        self.steps, self.topk, self.tree_size = config.num_speculative_tokens, config.topk, config.num_draft_tokens - 1
        self.device = device

    @property
    def capture_layers(self) -> tuple[int, ...]:
        return self.draft.config.aux_layer_ids

    def _to_device(self, a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(a)
        return (t.pin_memory() if self.device.type == "cuda" else t).to(self.device, non_blocking=True)

    def _meta(self, query_lens: list[int], cache_pos: np.ndarray, seq_lens: list[int], tables: list[list[int]],
              tree: TreeMask | None = None) -> AttentionMetadata:
        rows = block_table_array(tables, len(tables))
        seq_of_token = np.repeat(np.arange(len(tables)), query_lens)
        starts = np.zeros(len(tables) + 1, dtype=np.int32)
        np.cumsum(query_lens, out=starts[1:])
        return AttentionMetadata(
            query_start_loc=self._to_device(starts), seq_lens=self._to_device(np.asarray(seq_lens, dtype=np.int32)),
            query_lens_host=list(query_lens), seq_lens_host=list(seq_lens),
            groups={FULL_GROUP: BlockTables(self._to_device(rows),
                                            self._to_device(slots(rows, seq_of_token, cache_pos, self.block_size)))},
            tree=tree)

    @torch.inference_mode()
    def propose(self, aux: torch.Tensor, inputs: list[DraftInput]) -> list[DraftTree | None]:
        """aux [T, 3H]: the step's captured target states. Returns each input's draft (None where
        depth is 0)."""
        if not inputs:
            return []
        draft = self.draft
        ids, pos, query_lens, seq_lens = flat_tokens([i.next_tokens for i in inputs], [i.start for i in inputs])
        rows = torch.from_numpy(np.fromiter((r for i in inputs for r in i.rows), dtype=np.int64)).to(aux.device)
        hidden = draft.project(aux[rows])
        meta = self._meta(query_lens, pos, seq_lens, [i.block_table for i in inputs])
        normed, prenorm = draft(self._to_device(ids), hidden, self._to_device(pos), meta, self.kv_cache)
        grow = [k for k, i in enumerate(inputs) if i.depth > 0]
        out: list[DraftTree | None] = [None] * len(inputs)
        if not grow:
            return out
        last = self._to_device(np.cumsum(query_lens, dtype=np.int64)[grow] - 1)
        p0 = np.asarray([seq_lens[k] - 1 for k in grow], dtype=np.int64)  # the last first-pass position
        tables = [inputs[k].block_table for k in grow]
        expand = self._chain if self.topk == 1 else self._tree
        for k, tree in zip(grow, expand(normed[last], prenorm[last], p0, tables), strict=True):
            out[k] = tree.trimmed(inputs[k].depth)
        return out

    def _chain(self, normed: torch.Tensor, hidden: torch.Tensor, p0: np.ndarray, tables: list[list[int]],
               ) -> list[DraftTree]:
        draft = self.draft
        b = len(tables)
        tok = draft.to_target(draft.logits(normed).argmax(-1))
        guesses = [tok]
        for s in range(1, self.steps):
            pos = p0 + s  # the row of the depth-s guess
            meta = self._meta([1] * b, pos, (pos + 1).tolist(), tables)
            normed, hidden = draft(tok, hidden, self._to_device(pos), meta, self.kv_cache)
            tok = draft.to_target(draft.logits(normed).argmax(-1))
            guesses.append(tok)
        return [DraftTree.chain(row) for row in torch.stack(guesses, dim=1).tolist()]

    def _tree(self, normed: torch.Tensor, hidden: torch.Tensor, p0: np.ndarray, tables: list[list[int]],
              ) -> list[DraftTree]:
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
        base = p0 + 1  # cache position of the first expansion row
        for s in range(1, self.steps):
            j = (s - 1) * k + torch.arange(k, device=dev)  # this pass's expansion row of each beam
            bits = beam_bits | (1 << j)[None, :]
            tokens_in = torch.cat(cand_tokens, dim=1).gather(1, beam_cand)
            cache_pos = (base[:, None] + (s - 1) * k + np.arange(k)[None, :]).reshape(-1)
            real = self._to_device(np.repeat(p0 + s, k))
            tree = TreeMask(bits.reshape(-1), real, self._to_device(base.astype(np.int32)))
            meta = self._meta([k] * b, cache_pos, (base + s * k).tolist(), tables, tree)
            out_normed, out_hidden = draft(tokens_in.reshape(-1), beam_hidden.reshape(b * k, h), real, meta,
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
        tokens = torch.cat(cand_tokens, dim=1).tolist()
        scores = torch.cat(cand_scores, dim=1).float().tolist()
        parents = torch.cat(cand_parents, dim=1).tolist()
        return [select_tree(t, p, sc, self.tree_size) for t, p, sc in zip(tokens, parents, scores, strict=True)]


def slots(rows: np.ndarray, seq_of_token: np.ndarray, pos: np.ndarray, block_size: int) -> np.ndarray:
    """Each token's KV slot, -1 where its sequence has no block for the position (no write)."""
    col = pos // block_size
    inside = col < rows.shape[1]
    blocks = np.where(inside, rows[seq_of_token, np.minimum(col, rows.shape[1] - 1)], -1).astype(np.int64)
    return np.where(blocks >= 0, blocks * block_size + pos % block_size, -1)
