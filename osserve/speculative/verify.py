"""Verification: which draft tokens the target accepts, and the token it adds, without changing the
distribution of the output.

The target's forward gives logits for every verified row: the root (the last known token) and each
draft node. From the root, at node u:
- greedy: accept the child whose token is the target's argmax at u, if there is one; else stop
  and emit the argmax.
- sampling (temperature > 0, with top-k / top-p / min-p as the sampler applies them): with p the
  target's distribution at u and one coin c ~ U(0, 1), walk u's children in order and accept the
  first whose cumulative probability p(c1) + ... + p(ci) exceeds c; if none, emit a token drawn
  from p with u's children removed (renormalised).
A child is thus accepted with probability p(child) and the residual draw covers the rest, so the
emitted token at u follows p exactly: rejection sampling for drafts that are deterministic (EAGLE3's
top-k and prompt lookup propose without sampling; vLLM and SGLang verify them the same way). Siblings
carry distinct tokens (tree.py). Reaching a leaf, the next token is drawn from p at the leaf.

Everything that touches the vocabulary runs on the device in a few batched ops; the host gets per
row the argmax, the coin, the residual draw, and per node its probability, and walks the trees.
A request with its own seed draws its coins and residual tokens from its generator.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.worker.sampler import apply_min_p, apply_top_k_top_p
from osserve.speculative.tree import DraftTree

EMPTY_RESIDUAL = 1e-9  # below this the children hold all of p: one of them is taken


@dataclass
class VerifyRequest:
    params: SamplingParams
    tree: DraftTree  # no nodes: the root's row alone (a request sampling one token)
    generator: torch.Generator | None = None


@dataclass
class Verdict:
    accepted: list[int]  # the nodes accepted, root to leaf
    tokens: list[int]  # their tokens, then the token the target adds


def verify(logits: torch.Tensor, requests: list[VerifyRequest], vocab_size: int | None = None) -> list[Verdict]:
    """logits [R, V] float32: each request's root row, then one row per node, requests in order."""
    offsets, r = [], 0
    for req in requests:
        offsets.append(r)
        r += 1 + len(req.tree)
    assert logits.shape[0] == r, (logits.shape, r)
    argmax = logits.argmax(-1).tolist()
    sampled = [i for i, req in enumerate(requests) if req.params.temperature > 0]
    draws = _sampled_rows(logits, [requests[i] for i in sampled], [offsets[i] for i in sampled],
                          vocab_size or logits.shape[-1]) if sampled else {}
    out = []
    for i, req in enumerate(requests):
        kids = req.tree.children()
        base = offsets[i]
        u, path = -1, list[int]()
        while True:
            children = kids.get(u, [])
            row = base + u + 1
            if req.params.temperature == 0:
                best = argmax[row]
                nxt = next((c for c in children if req.tree.tokens[c] == best), None)
                final = best
            else:
                coin, residual, residual_mass, child_p = draws[row]
                nxt, cumulative = None, 0.0
                for c in children:
                    cumulative += child_p[c]
                    if coin < cumulative:
                        nxt = c
                        break
                if nxt is None and children and residual_mass <= EMPTY_RESIDUAL:
                    nxt = max(children, key=lambda c: child_p[c])  # rounding left the coin past the children
                final = residual
            if nxt is None:
                out.append(Verdict(path, [req.tree.tokens[c] for c in path] + [final]))
                break
            path.append(nxt)
            u = nxt
    return out


def keep_top_k(scaled: torch.Tensor, top_k: list[int]) -> torch.Tensor:
    """Each row's top_k largest values kept, the rest -inf: the sampler's top-k without its full
    sort (a partial top-k; rows tied at their k-th value keep every tie, which the sampler's sort
    breaks arbitrarily)."""
    most = max(top_k)
    values = scaled.topk(most, dim=-1).values
    kth = values.gather(1, torch.tensor(top_k, device=scaled.device)[:, None].clamp(max=most) - 1)
    return scaled.masked_fill(scaled < kth, float("-inf"))


def _sampled_rows(logits: torch.Tensor, requests: list[VerifyRequest], offsets: list[int], vocab_size: int,
                  ) -> dict[int, tuple[float, int, float, dict[int, float]]]:
    """Per row of the sampling requests: (its coin, a draw from p without its children, the
    probability left to non-children, {child node: p(child)})."""
    rows: list[int] = []
    temps: list[float] = []
    top_k: list[int] = []
    top_p: list[float] = []
    min_p: list[float] = []
    for req, base in zip(requests, offsets, strict=True):
        n = 1 + len(req.tree)
        rows.extend(range(base, base + n))
        p = req.params
        temps += [p.temperature] * n
        top_k += [p.top_k if 0 < p.top_k < vocab_size else vocab_size] * n
        top_p += [p.top_p] * n
        min_p += [p.min_p] * n
    dev = logits.device
    index = torch.tensor(rows, device=dev)
    scaled = logits[index] / torch.tensor(temps, device=dev)[:, None]
    if any(x < 1.0 for x in top_p):
        scaled = apply_top_k_top_p(scaled, torch.tensor(top_k, device=dev) if any(k < vocab_size for k in top_k)
                                   else None, torch.tensor(top_p, device=dev))
    elif any(k < vocab_size for k in top_k):
        scaled = keep_top_k(scaled, top_k)
    if any(x > 0.0 for x in min_p):
        scaled = apply_min_p(scaled, torch.tensor(min_p, device=dev))
    probs = scaled.softmax(-1)  # [N, V]
    # Each node's probability under its parent's row, and those children removed for the residual.
    local = {row: k for k, row in enumerate(rows)}
    child_rows, child_tokens, child_keys = [], [], []
    for req, base in zip(requests, offsets, strict=True):
        for c, (tok, parent) in enumerate(zip(req.tree.tokens, req.tree.parents, strict=True)):
            child_rows.append(local[base + parent + 1])
            child_tokens.append(tok)
            child_keys.append((base, c))
    if child_rows:
        cr, ct = torch.tensor(child_rows, device=dev), torch.tensor(child_tokens, device=dev)
        child_p = probs[cr, ct].tolist()
        residual = probs.index_put((cr, ct), torch.zeros(len(child_rows), device=dev))
    else:
        child_p, residual = [], probs
    mass = residual.sum(-1)
    # Rows whose children hold all of p draw from p itself (the draw is not used: a child is taken).
    weights = torch.where(mass[:, None] > EMPTY_RESIDUAL, residual, probs)
    draws = torch.empty(len(rows), dtype=torch.int64, device=dev)
    coins = torch.empty(len(rows), device=dev)
    unseeded = [k for k, req in enumerate(requests) if req.generator is None]
    spans: list[tuple[int, int]] = []
    for req in requests:
        start = spans[-1][1] if spans else 0
        spans.append((start, start + 1 + len(req.tree)))
    if len(unseeded) == len(requests):  # one draw for the lot
        draws = torch.multinomial(weights, 1)[:, 0]
        coins = torch.rand(len(rows), device=dev)
    elif unseeded:
        index = torch.tensor([j for i in unseeded for j in range(*spans[i])], device=dev)
        draws[index] = torch.multinomial(weights[index], 1)[:, 0]
        coins[index] = torch.rand(len(index), device=dev)
    for req, (a, b) in zip(requests, spans, strict=True):
        if req.generator is not None:  # its own stream: independent of the batch
            draws[a:b] = torch.multinomial(weights[a:b], 1, generator=req.generator)[:, 0]
            coins[a:b] = torch.rand(b - a, device=dev, generator=req.generator)
    draw_list, mass_list = draws.tolist(), mass.tolist()
    coin_list = coins.tolist()
    by_base: dict[int, dict[int, float]] = {}
    for (base, c), p_c in zip(child_keys, child_p, strict=True):
        by_base.setdefault(base, {})[c] = p_c
    out = {}
    for req, base in zip(requests, offsets, strict=True):
        ps = by_base.get(base, {})
        for row in range(base, base + 1 + len(req.tree)):
            out[row] = (coin_list[local[row]], draw_list[local[row]], mass_list[local[row]], ps)
    return out
