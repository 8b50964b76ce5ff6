"""Benchmark-only acceptance control: never reachable from a request or a flag.

Random weights accept almost no draft, so a speed measurement at a given acceptance length (AL)
needs help. benchmarks/bench_spec.py sets `SpeculativeDecoder.oracle` to one of these after a plain
run recorded each request's greedy output: the draft still runs (its cost is real), then along the
tree each depth's token is set to the recorded one with probability `accept`, on one of the
branches that reach deepest (a random one among them), and at the first miss every sibling is
made wrong. The target then verifies as usual (greedy), so
the output is the real greedy text and the mean AL is 1 + accept + accept^2 + ... + accept^depth.
Where a request's output has left its recording (numerics), its drafts are left as drafted.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from osserve.speculative.tree import DraftTree


def acceptance_for(mean_length: float, depth: int) -> float:
    """The per-draft probability a with 1 + a + ... + a^depth = mean_length (bisection)."""
    if mean_length <= 1.0:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(mid ** i for i in range(depth + 1)) < mean_length:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass
class AcceptanceOracle:
    continuations: dict[str, list[int]]  # request id -> its recorded greedy output
    accept: float
    vocab_size: int
    seed: int = 0
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def rewrite(self, request_id: str, output: list[int], tree: DraftTree) -> DraftTree:
        cont = self.continuations.get(request_id)
        if cont is None or output != cont[: len(output)]:
            return tree
        tokens = list(tree.tokens)
        kids = tree.children()
        below = [0] * len(tokens)  # each node's depth of subtree under it
        for i in range(len(tokens) - 1, -1, -1):
            below[i] = 1 + max((below[c] for c in kids.get(i, [])), default=0)
        u, at = -1, len(output)
        while at < len(cont) and kids.get(u):
            children = kids[u]
            correct = cont[at]
            deepest = max(below[c] for c in children)
            chosen = self.rng.choice([c for c in children if below[c] == deepest])
            hit = self.rng.random() < self.accept
            for c in children:
                if tokens[c] == correct and not (hit and c == chosen):
                    tokens[c] = self._wrong(correct, {tokens[x] for x in children})
            if not hit:
                break
            tokens[chosen] = correct
            u, at = chosen, at + 1
        return DraftTree(tuple(tokens), tree.parents)

    def _wrong(self, correct: int, taken: set[int]) -> int:
        t = (correct + 1) % self.vocab_size
        while t in taken or t == correct:
            t = (t + 1) % self.vocab_size
        return t
