"""Draft trees: the shape of one request's speculative tokens for one step.

The root is the request's last token (known, its KV not yet computed); the nodes are draft tokens
after it. Node i has a token and a parent (-1: the root, else an earlier node), so nodes stand in
depth order: parents before children. That is the order they are verified in (one target forward
over the root and then node 0, 1, ... at consecutive cache positions) and the order of the
attention bits (ops/attention/metadata.TreeMask: bit 0 the root, bit i + 1 node i).

A chain (node i's parent is node i - 1) is the tree of `topk` 1 and of the n-gram proposer; it
needs no attention mask, its rows are plain causal. Siblings never share a token: the verifier
(speculative/verify.py) counts each child's probability once.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DraftTree:
    tokens: tuple[int, ...]
    parents: tuple[int, ...]  # -1: the root

    def __post_init__(self) -> None:
        assert len(self.tokens) == len(self.parents)
        assert all(-1 <= p < i for i, p in enumerate(self.parents)), self.parents

    @classmethod
    def chain(cls, tokens: list[int] | tuple[int, ...]) -> DraftTree:
        return cls(tuple(tokens), tuple(range(-1, len(tokens) - 1)))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def depths(self) -> list[int]:
        """Each node's depth: 1 for the root's children."""
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p < 0 else out[p] + 1)
        return out

    @property
    def max_depth(self) -> int:
        return max(self.depths(), default=0)

    def children(self) -> dict[int, list[int]]:
        """Node -> its children in order (the root is -1)."""
        out: dict[int, list[int]] = {}
        for i, p in enumerate(self.parents):
            out.setdefault(p, []).append(i)
        return out

    def attention_bits(self) -> list[int]:
        """Per verified row (the root, then each node), the rows it sees: itself and its ancestors,
        as bits (bit 0 the root, bit i + 1 node i)."""
        bits = [1]
        for i, p in enumerate(self.parents):
            bits.append(bits[p + 1] | (1 << (i + 1)))
        return bits

    def path(self, node: int) -> list[int]:
        """The nodes from depth 1 down to `node`."""
        out = []
        while node >= 0:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def trimmed(self, max_depth: int) -> DraftTree:
        """The nodes at depth <= max_depth (an ancestor-closed prefix of the order)."""
        keep = [i for i, d in enumerate(self.depths()) if d <= max_depth]
        if len(keep) == len(self.tokens):
            return self
        index = {old: new for new, old in enumerate(keep)}
        return DraftTree(tuple(self.tokens[i] for i in keep),
                         tuple(-1 if self.parents[i] < 0 else index[self.parents[i]] for i in keep))


def select_tree(tokens: list[int], parents: list[int], scores: list[float], size: int) -> DraftTree:
    """EAGLE-2's reranking: from candidates in generation order (parents before children, a
    parent -1 meaning the root; scores are cumulative log-probabilities, so a child never beats its
    parent), the `size` best that form a tree, each with its ancestors, siblings with distinct
    tokens (the better one kept). Returned in depth order."""
    order = sorted(range(len(tokens)), key=lambda i: (-scores[i], i))
    chosen: set[int] = set()
    seen: set[tuple[int, int]] = set()  # (parent, token) of chosen nodes
    for i in order:
        if len(chosen) == size:
            break
        p = parents[i]
        if (p >= 0 and p not in chosen) or (p, tokens[i]) in seen:
            continue  # an orphan (its parent lost a tie or was a duplicate), or a repeated sibling
        chosen.add(i)
        seen.add((p, tokens[i]))
    depth: dict[int, int] = {}
    for i in range(len(tokens)):
        depth[i] = 1 if parents[i] < 0 else depth[parents[i]] + 1
    kept = sorted(chosen, key=lambda i: (depth[i], i))
    index = {old: new for new, old in enumerate(kept)}
    return DraftTree(tuple(tokens[i] for i in kept),
                     tuple(-1 if parents[i] < 0 else index[parents[i]] for i in kept))
