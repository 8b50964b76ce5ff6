"""The fused MXFP4 MoE kernel against moe_reference, in float32 under TRITON_INTERPRET=1 on CPU."""

from __future__ import annotations

import pytest
import torch

from osserve.ops.moe import plan as moe_align
from osserve.ops.moe import tiled as moe_triton
from osserve.ops.moe.dispatch import fused_moe
from osserve.ops.moe.layout import prepare_mxfp4_experts
from osserve.ops.moe.plan import align_tokens
from osserve.ops.moe.reference import moe_reference
from osserve.ops.moe.tiled import MoEConfig, fused_moe_triton
from tests.ops.moe_fixtures import poison_fresh_buffers, random_experts, random_routing

LIMIT = 7.0
SMALL = MoEConfig(16, 32, 64, 4, 1, 32, 64, 4, 1)  # EVEN_K at H=I=64
MASKED_K = MoEConfig(16, 16, 128, 4, 1, 16, 128, 4, 1)  # BLOCK_K > K: exercises the K masks
WIDE = MoEConfig(32, 64, 64, 4, 1, 128, 32, 4, 1)  # BLOCK_N > N in GEMM2: exercises the N masks


@pytest.fixture(autouse=True)
def poison(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every fresh buffer the kernels allocate starts as NaN / garbage, so unwritten entries show."""
    poison_fresh_buffers(monkeypatch, moe_triton, moe_align)


def _check(num_tokens: int, num_experts: int, top_k: int, hidden: int, inter: int, mode: str,
           config: MoEConfig | None) -> None:
    experts = random_experts(num_experts, hidden, inter)
    x = torch.randn(num_tokens, hidden)
    weights, ids = random_routing(num_tokens, num_experts, top_k, mode)
    ref = moe_reference(x, weights, ids, experts, LIMIT)
    out = fused_moe_triton(x, weights, ids, prepare_mxfp4_experts(experts), LIMIT, config)
    assert out.shape == ref.shape and torch.isfinite(out).all()
    err = (out - ref).norm() / ref.norm()
    assert err < 1e-4, f"relative error {err:.2e}"


@pytest.mark.parametrize("num_tokens", [1, 2, 7, 33])
@pytest.mark.parametrize("num_experts,top_k", [(4, 2), (8, 4)])
def test_matches_reference(num_tokens: int, num_experts: int, top_k: int) -> None:
    _check(num_tokens, num_experts, top_k, 64, 64, "uniform", SMALL)


@pytest.mark.parametrize("mode", ["skewed", "sparse"])
def test_skewed_and_empty_experts(mode: str) -> None:
    _check(33, 8, 4, 64, 64, mode, SMALL)


@pytest.mark.parametrize("config", [MASKED_K, WIDE, None], ids=["masked_k", "wide_n", "default"])
def test_configs_and_odd_shapes(config: MoEConfig | None) -> None:
    # H=96, I=32: K not a multiple of BLOCK_K, N smaller than BLOCK_N.
    _check(7, 6, 3, 96, 32, "uniform", config)


def plan_reference(ids: torch.Tensor, num_experts: int, block_m: int, max_padded: int, max_blocks: int,
                   ) -> tuple[list[int], list[int], int]:
    """(sorted_slots, block_expert, num_padded) by hand: each expert's slots in slot order, padded
    with the sentinel T*k to a multiple of block_m; the sentinel and tile expert -1 past the end."""
    flat = ids.reshape(-1).tolist()
    sentinel = len(flat)
    slots: list[int] = []
    tiles: list[int] = []
    for e in range(num_experts):
        mine = [s for s, x in enumerate(flat) if x == e]
        padded = -(-len(mine) // block_m) * block_m
        slots += mine + [sentinel] * (padded - len(mine))
        tiles += [e] * (padded // block_m)
    used = len(slots)
    return slots + [sentinel] * (max_padded - used), tiles + [-1] * (max_blocks - len(tiles)), used


@pytest.mark.parametrize("mode", ["uniform", "skewed", "sparse"])
@pytest.mark.parametrize("id_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("chunk", [16, 1024])
def test_align_tokens_plan(mode: str, id_dtype: torch.dtype, chunk: int) -> None:
    """The kernel reads the router's int64 ids as they are (and int32 ones): the plan built by hand,
    every entry of every buffer, whether a program reads the slots in one chunk or in several."""
    num_tokens, num_experts, top_k, block_m = 37, 8, 4, 16
    _, ids = random_routing(num_tokens, num_experts, top_k, mode)
    ids = ids.to(id_dtype)
    plan = align_tokens(ids, num_experts, block_m, chunk=chunk)
    slots, tiles, used = plan_reference(ids, num_experts, block_m, plan.sorted_slots.numel(), plan.max_blocks)
    assert int(plan.num_padded.item()) == used
    assert plan.sorted_slots.tolist() == slots
    assert plan.block_expert.tolist() == tiles


def test_fused_moe_dispatch_keeps_reference_on_cpu() -> None:
    experts = random_experts(4, 64, 64)
    x = torch.randn(3, 64)
    weights, ids = random_routing(3, 4, 2)
    ref = moe_reference(x, weights, ids, experts, LIMIT)
    experts.prepared = prepare_mxfp4_experts(experts)  # CPU tensors: fused_moe still takes the reference path
    torch.testing.assert_close(fused_moe(x, weights, ids, experts, LIMIT), ref)
