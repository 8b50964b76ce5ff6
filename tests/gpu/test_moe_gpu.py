"""Fused MXFP4 MoE at the real 20b shapes on the GPU: bf16 vs a float32 reference."""

from __future__ import annotations

import pytest
import torch

from osserve.ops.moe import fused_moe, moe_reference
from osserve.ops.moe_triton import fused_moe_triton
from tests.ops.test_moe_triton import random_experts, routing

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def experts():  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(0)
    return random_experts(32, 2880, 2880, g, "cuda")


@pytest.mark.parametrize("op", [fused_moe_triton, fused_moe], ids=["grouped", "dispatch"])
@pytest.mark.parametrize("t", [1, 2, 7, 64, 300, 4096])
@pytest.mark.parametrize("skew", ["none", "one", "empty"])
def test_moe_matches_reference(experts, t: int, skew: str, op) -> None:  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(t)
    x = torch.randn(t, 2880, generator=g).cuda()
    w, ids = routing(t, 32, 4, g, skew)
    w, ids = w.cuda(), ids.cuda()
    ref = moe_reference(x.float(), w.float(), ids, experts, 7.0)
    out = op(x.bfloat16(), w.bfloat16(), ids, experts, 7.0).float()
    assert torch.isfinite(out).all()
    assert ((out - ref).norm() / ref.norm()).item() < 1e-2
