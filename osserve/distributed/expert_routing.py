"""Expert parallelism: a rank's view of the router's choices.

The router is replicated, so every rank sees each token's k experts (global ids). A rank holds
experts [first, first + n) and runs, for each token, only the slots whose expert it holds; the
all-reduce after the MoE adds the ranks' shares. The fused MoE kernels take ids in [0, n), so
another rank's slot is kept with weight 0 (its product, finite after the clamped SwiGLU, adds
exactly 0) on an expert this rank runs for that token anyway: its first own expert, or where it
has none, expert t mod n, spread over the rank's experts. At decode sizes that reads no expert's
weights the rank would not read, but every rank computes all T·k slots: at large batches N times
the MoE's arithmetic of an exact split. A kernel that skips foreign slots is the next step.
"""

from __future__ import annotations

import torch


def own_share(weights: torch.Tensor, ids: torch.Tensor, experts: range) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k], ids [T, k] global) -> the same with another rank's slots at weight 0 and
    every id local to this rank, in [0, len(experts))."""
    n = len(experts)
    local = ids - experts.start
    mine = (local >= 0) & (local < n)
    own = torch.where(mine, local, n)
    first = own.min(dim=1, keepdim=True).values  # n where the token has none of this rank's experts
    spread = torch.arange(ids.shape[0], device=ids.device, dtype=ids.dtype)[:, None] % n
    fallback = torch.where(first < n, first, spread)
    return torch.where(mine, weights, 0), torch.where(mine, local, fallback)
