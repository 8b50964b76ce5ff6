"""The fused small-batch router's token range and its scratch counters: a leaf that both the
dispatch (which allocates the scratch) and the kernel (fused_triton.py) read."""

from __future__ import annotations

import torch

FUSED_MAX_TOKENS = 128  # the fused logits + top-k kernel's range; above it cuBLAS wins


def router_counters(device: torch.device | str) -> torch.Tensor:
    """Zeroed scratch for the fused small-batch router (one counter per token block, so at most
    one per token); the kernel leaves it zeroed. One per caller that may run concurrently with
    another: the model keeps one per layer."""
    return torch.zeros(FUSED_MAX_TOKENS, dtype=torch.int32, device=device)
