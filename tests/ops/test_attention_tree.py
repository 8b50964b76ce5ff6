"""Draft-tree attention (speculative decoding, ops/attention/metadata.TreeMask).

The reference is checked against its meaning: each node of a tree, verified in one call beside its
siblings, attends exactly as the last token of a plain sequence holding only its own path would
(committed context, root, ancestors), sinks and sliding window included. The Triton prefill kernel
is then checked against the reference (TRITON_INTERPRET=1 on CPU), for trees beside plain prefill
and decode rows, and for the draft's tree expansion, whose tree starts before the queried rows."""

from __future__ import annotations

import os
import random

import pytest
import torch

from osserve.ops.attention.metadata import TreeMask
from osserve.ops.attention.reference import paged_attention_reference
from osserve.speculative.tree import DraftTree
from tests.ops.attention_cases import Case, make_case, rel_err

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA or TRITON_INTERPRET=1",
)


def random_tree(n: int, seed: int, max_children: int = 3) -> DraftTree:
    rng = random.Random(seed)
    parents: list[int] = []
    for i in range(n):
        options = [p for p in range(-1, i) if sum(q == p for q in parents) < max_children]
        parents.append(rng.choice(options[-4:]))  # recent parents: deeper trees
    return DraftTree(tuple(range(n)), tuple(parents))


def tree_mask(case: Case, trees: dict[int, DraftTree]) -> TreeMask:
    """The mask of a batch whose sequence b verifies trees[b] (root + nodes: its whole chunk); the
    other sequences are plain (bits -1, start past their end)."""
    bits, positions, starts = [], [], []
    for b, seq_len in enumerate(case.seq_lens):
        q_len = case.query_start_loc[b + 1] - case.query_start_loc[b]
        first = seq_len - q_len
        tree = trees.get(b)
        if tree is None:
            bits += [-1] * q_len
            positions += list(range(first, seq_len))
            starts.append(seq_len)
        else:
            assert q_len == len(tree) + 1
            bits += tree.attention_bits()
            positions += [first] + [first + d for d in tree.depths()]
            starts.append(first)
    dev = case.q.device
    return TreeMask(torch.tensor(bits, dtype=torch.int64, device=dev),
                    torch.tensor(positions, dtype=torch.int64, device=dev),
                    torch.tensor(starts, dtype=torch.int32, device=dev))


def run_reference(case: Case, tree: TreeMask | None) -> torch.Tensor:
    cpu = TreeMask(tree.bits.cpu(), tree.positions.cpu(), tree.start.cpu()) if tree is not None else None
    return paged_attention_reference(case.q.float().cpu(), case.k_cache.float().cpu(), case.v_cache.float().cpu(),
                                     case.sinks.float().cpu(), case.query_start_loc, case.seq_lens,
                                     case.block_tables.cpu(), case.scale, case.window, cpu)


@pytest.mark.parametrize("window", [None, 16])
@pytest.mark.parametrize("context", [5, 40])
def test_each_node_sees_what_its_own_path_would(window: int | None, context: int) -> None:
    tree = random_tree(9, seed=context + (window or 0))
    n = len(tree) + 1
    case = make_case([(context + n, n)], 4, 2, 16, 4, window, seed=3)
    out = run_reference(case, tree_mask(case, {0: tree}))
    k_rows = case.k_cache.view(-1, 2, 16)
    v_rows = case.v_cache.view(-1, 2, 16)

    def slot(pos: int) -> int:
        return int(case.block_tables[0, pos // 4]) * 4 + pos % 4

    for node in range(-1, len(tree)):
        path = [] if node < 0 else tree.path(node)
        # The same sequence as a chain: context, root, then the path's nodes at consecutive positions.
        chain = make_case([(context + 1 + len(path), 1)], 4, 2, 16, 4, window, seed=3)
        ck, cv = chain.k_cache.view(-1, 2, 16), chain.v_cache.view(-1, 2, 16)
        positions = list(range(context + 1)) + [context + 1 + i for i in path]
        for new_pos, old_pos in enumerate(positions):
            dst = int(chain.block_tables[0, new_pos // 4]) * 4 + new_pos % 4
            if dst >= 0 and chain.block_tables[0, new_pos // 4] >= 0:
                ck[dst], cv[dst] = k_rows[slot(old_pos)], v_rows[slot(old_pos)]
        chain.q = case.q[node + 1: node + 2].clone()
        chain.sinks = case.sinks
        expected = run_reference(chain, None)
        assert torch.allclose(out[node + 1], expected[0], atol=1e-5), node


@needs_triton
@pytest.mark.parametrize("window", [None, 8, 16])
@pytest.mark.parametrize("block_size", [4, 16])
def test_triton_trees_beside_prefill_and_decode(window: int | None, block_size: int) -> None:
    trees = {0: random_tree(6, 1), 2: DraftTree.chain(range(4)), 3: random_tree(20, 2, max_children=4)}
    seqs = [(30, 7), (45, 13), (19, 5), (70, 21), (33, 1)]
    case = make_case(seqs, 4, 2, 16, block_size, window, device=DEVICE, seed=11 + block_size,
                     outside="poison")
    mask = tree_mask(case, trees)
    from osserve.ops.attention.paged_triton import paged_attention_triton

    qsl, seq_lens = case.device_meta()
    out = torch.full_like(case.q, float("nan"))
    paged_attention_triton(case.q, case.k_cache, case.v_cache, case.sinks, qsl, seq_lens, case.block_tables,
                           case.scale, case.window, 21, 70, False, out=out, tree=mask)
    ref = run_reference(case, mask)
    assert not out.isnan().any()
    assert rel_err(out.cpu(), ref) < 1e-4


@needs_triton
@pytest.mark.parametrize("beams", [2, 4])
def test_triton_draft_expansion_rows(beams: int) -> None:
    """The draft's tree expansion: `beams` query rows at step 3 of a tree whose earlier steps stand
    before them in the cache (tree start before the chunk), each seeing only its own ancestors."""
    rng = random.Random(beams)
    steps, committed = 3, 26
    seq_len = committed + steps * beams
    case = make_case([(seq_len, beams), (12, 1)], 4, 2, 16, 4, None, device=DEVICE, seed=beams)
    bits_of: list[int] = []
    for s in range(steps):
        for b in range(beams):
            j = s * beams + b
            parent = bits_of[(s - 1) * beams + rng.randrange(beams)] if s else 0
            bits_of.append(parent | (1 << j))
    real = [committed - 1 + steps] * beams  # the beams' real position: the last committed + their depth
    dev = case.q.device
    mask = TreeMask(torch.tensor(bits_of[-beams:] + [-1], dtype=torch.int64, device=dev),
                    torch.tensor(real + [11], dtype=torch.int64, device=dev),
                    torch.tensor([committed, 12], dtype=torch.int32, device=dev))
    from osserve.ops.attention.paged_triton import paged_attention_triton

    qsl, seq_lens = case.device_meta()
    out = paged_attention_triton(case.q, case.k_cache, case.v_cache, case.sinks, qsl, seq_lens, case.block_tables,
                                 case.scale, None, beams, seq_len, False, tree=mask)
    ref = run_reference(case, mask)
    assert rel_err(out.cpu(), ref) < 1e-4
    # And the reference agrees with its meaning: a beam sees the committed keys and its own chain only.
    keys = torch.arange(seq_len)
    for row in range(beams):
        seen = [k for k in keys.tolist() if k < committed or (bits_of[-beams + row] >> (k - committed)) & 1]
        assert len(seen) == committed + steps
