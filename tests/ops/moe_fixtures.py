"""Random MXFP4 experts and routings, shared by the MoE kernel tests and benchmarks."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from osserve.ops.moe.weights import ExpertWeights


def plan_tiles(plan) -> tuple[int, list[tuple[int, list[int]]]]:  # noqa: ANN001
    """A routing plan up to the order of its tiles, which the MoE kernels do not depend on (each
    tile reads its own expert): (rows in use, [(expert, the tile's slots)] sorted). The one-token
    plan (moe_align.plan_one_token) lists its tiles in slot order, align_tokens in expert order."""
    used = int(plan.num_padded.item())
    slots, experts = plan.sorted_slots[:used].tolist(), plan.block_expert.tolist()
    block_m = plan.block_m
    return used, sorted((experts[i], slots[i * block_m:(i + 1) * block_m]) for i in range(used // block_m))


def poison_fresh_buffers(monkeypatch: pytest.MonkeyPatch, *modules: ModuleType) -> None:
    """Make each module's `_empty` return NaN / garbage, so entries a kernel leaves unwritten show."""

    def poisoned(*shape, dtype: torch.dtype, device: str | torch.device) -> torch.Tensor:
        fill = float("nan") if dtype.is_floating_point else -(2**30)
        return torch.full(shape, fill, dtype=dtype, device=device)

    for module in modules:
        monkeypatch.setattr(module, "_empty", poisoned)


def random_experts(
    num_experts: int, hidden: int, inter: int, device: str | torch.device = "cpu"
) -> ExpertWeights:
    """Random nibbles, scales 2^-4..2^0 (E8M0 123..127), biases ~ N(0, 0.1^2) in float32; drawn on
    `device` (a 120b layer is 1.7 GB of nibbles)."""

    def blocks(rows: int, cols: int) -> torch.Tensor:
        shape = (num_experts, rows, cols // 32, 16)
        return torch.randint(0, 256, shape, dtype=torch.uint8, device=device)

    def scales(rows: int, cols: int) -> torch.Tensor:
        return torch.randint(123, 128, (num_experts, rows, cols // 32), dtype=torch.uint8, device=device)

    return ExpertWeights(
        gate_up_blocks=blocks(2 * inter, hidden),
        gate_up_scales=scales(2 * inter, hidden),
        gate_up_bias=0.1 * torch.randn(num_experts, 2 * inter, device=device),
        down_blocks=blocks(hidden, inter),
        down_scales=scales(hidden, inter),
        down_bias=0.1 * torch.randn(num_experts, hidden, device=device),
    )


def random_routing(
    num_tokens: int, num_experts: int, top_k: int, mode: str = "uniform", device: str | torch.device = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] float32 softmax, ids [T, k] int64). Modes: uniform, skewed (all tokens on the
    same k experts), sparse (only experts 0..k, so most experts get no tokens)."""
    if mode == "uniform":
        ids = torch.rand(num_tokens, num_experts).topk(top_k, dim=-1).indices
    elif mode == "skewed":
        ids = torch.arange(top_k).repeat(num_tokens, 1)
    elif mode == "sparse":
        ids = torch.rand(num_tokens, top_k + 1).topk(top_k, dim=-1).indices
    else:
        raise ValueError(mode)
    weights = torch.softmax(torch.randn(num_tokens, top_k), dim=-1)
    return weights.to(device), ids.to(device)
