"""Draft trees (speculative/tree.py) and prompt-lookup proposals (speculative/ngram.py)."""

from __future__ import annotations

from osserve.speculative.ngram import NgramProposer
from osserve.speculative.tree import DraftTree, select_tree


def test_tree_shape_bits_and_paths() -> None:
    tree = DraftTree((10, 11, 12, 13, 14), (-1, -1, 0, 0, 2))
    assert tree.depths() == [1, 1, 2, 2, 3] and tree.max_depth == 3 and not tree.is_chain
    assert tree.children() == {-1: [0, 1], 0: [2, 3], 2: [4]}
    # bit 0 the root, bit i + 1 node i: each row sees itself and its ancestors
    assert tree.attention_bits() == [0b1, 0b11, 0b101, 0b1011, 0b10011, 0b101011]
    assert tree.path(4) == [0, 2, 4]
    assert tree.trimmed(2) == DraftTree((10, 11, 12, 13), (-1, -1, 0, 0))
    chain = DraftTree.chain([5, 6, 7])
    assert chain.is_chain and chain.attention_bits() == [1, 3, 7, 15] and chain.trimmed(1) == DraftTree.chain([5])


def test_select_tree_takes_the_best_ancestor_closed_nodes() -> None:
    # candidates: depth 1: a (-1.0), b (-0.5); depth 2 under b: c (-0.7), under a: d (-1.2), a repeat of c (-0.9)
    tokens = [1, 2, 3, 4, 3]
    parents = [-1, -1, 1, 0, 1]
    scores = [-1.0, -0.5, -0.7, -1.2, -0.9]
    # nodes come in depth order, then generation order
    assert select_tree(tokens, parents, scores, 3) == DraftTree((1, 2, 3), (-1, -1, 1))
    assert select_tree(tokens, parents, scores, 10) == DraftTree((1, 2, 3, 4), (-1, -1, 1, 0))  # no repeated sibling
    # a child whose parent lost the cut (a tie broken by order) is left out, not orphaned
    assert select_tree([1, 2, 3], [-1, -1, 0], [-1.0, -0.5, -1.0], 2) == DraftTree((1, 2), (-1, -1))
    assert select_tree([1, 2, 3], [-1, -1, 1], [-1.0, -0.5, -1.0], 2) == DraftTree((1, 2), (-1, -1))


def test_ngram_proposes_what_followed_the_latest_match() -> None:
    ng = NgramProposer(num_tokens=3, n_min=1, n_max=3)
    text = [1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 6, 1, 2, 3]
    assert ng.propose("r", text) == [7, 8, 6]  # the suffix 1 2 3 last seen before 7 8 6
    assert ng.propose("r", text, limit=2) == [7, 8]
    assert ng.propose("r", text + [4]) == [5, 9, 1]  # 3-gram 2 3 4 seen once; the cache grew by one
    assert ng.propose("s", [1, 2, 3, 4]) == []
    assert NgramProposer(2, 2, 2).propose("t", [5, 6, 5, 7, 5]) == []  # no earlier 2-gram "7 5"
    assert NgramProposer(2, 1, 2).propose("t", [5, 6, 5, 7, 5]) == [7, 5]  # the 1-gram "5" at 2
    ng.drop("r")
    assert "r" not in ng.texts
