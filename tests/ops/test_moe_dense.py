"""The fused MXFP4 MoE kernels against the plain-PyTorch reference (TRITON_INTERPRET=1 on CPU)."""

from __future__ import annotations

import pytest
import torch

from osserve.ops.moe import ExpertWeights, moe_reference
from osserve.ops.moe_triton import MoEConfig, fused_moe_triton


def random_experts(e: int, h: int, i: int, g: torch.Generator, device: str = "cpu") -> ExpertWeights:
    def u8(shape: tuple[int, ...], lo: int, hi: int) -> torch.Tensor:
        return torch.randint(lo, hi, shape, generator=g, dtype=torch.int32).to(torch.uint8).to(device)

    return ExpertWeights(
        gate_up_blocks=u8((e, 2 * i, h // 32, 16), 0, 256), gate_up_scales=u8((e, 2 * i, h // 32), 122, 126),
        gate_up_bias=(torch.randn(e, 2 * i, generator=g) * 0.5).to(device),
        down_blocks=u8((e, h, i // 32, 16), 0, 256), down_scales=u8((e, h, i // 32), 120, 124),
        down_bias=(torch.randn(e, h, generator=g) * 0.1).to(device),
    )


def routing(t: int, e: int, k: int, g: torch.Generator, skew: str) -> tuple[torch.Tensor, torch.Tensor]:
    if skew == "one":  # every token's first choice is expert 0
        ids = torch.stack([torch.randperm(e - 1, generator=g)[: k - 1] + 1 for _ in range(t)])
        ids = torch.cat([torch.zeros(t, 1, dtype=torch.long), ids], 1)
    elif skew == "empty":  # experts 0..e/2-1 receive nothing
        ids = torch.stack([torch.randperm(e // 2, generator=g)[:k] + e // 2 for _ in range(t)])
    else:
        ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    w = torch.softmax(torch.randn(t, k, generator=g), -1)
    return w, ids


SMALL = MoEConfig(bm=16, bn=16, bk=64, num_warps=4, num_stages=1)


@pytest.mark.parametrize("t", [1, 2, 7, 33])
@pytest.mark.parametrize("skew", ["none", "one", "empty"])
def test_matches_reference(t: int, skew: str) -> None:
    g = torch.Generator().manual_seed(t * 7 + len(skew))
    e, h, i, k = 8, 64, 64, 4
    ex = random_experts(e, h, i, g)
    x = torch.randn(t, h, generator=g)
    w, ids = routing(t, e, k, g, skew)
    ref = moe_reference(x, w, ids, ex, 7.0)
    out = fused_moe_triton(x, w, ids, ex, 7.0, SMALL)
    assert torch.isfinite(out).all()
    rel = ((out - ref).norm() / ref.norm()).item()
    assert rel < 1e-4  # fp32 activations here: only summation order differs


def test_clamp_is_applied() -> None:
    g = torch.Generator().manual_seed(3)
    e, h, i, k = 4, 64, 64, 2
    ex = random_experts(e, h, i, g)
    ex.gate_up_bias = ex.gate_up_bias + 20.0  # drive gate and up far past the limit
    x = torch.randn(5, h, generator=g)
    w, ids = routing(5, e, k, g, "none")
    ref = moe_reference(x, w, ids, ex, 7.0)
    out = fused_moe_triton(x, w, ids, ex, 7.0, SMALL)
    assert ((out - ref).norm() / ref.norm()).item() < 1e-4


def test_triton_dequant_and_dense_prefill_path() -> None:
    from osserve.ops.moe_triton import dequantize_mxfp4_triton, moe_prefill_dense
    from osserve.ops.mxfp4 import dequantize_mxfp4

    g = torch.Generator().manual_seed(5)
    ex = random_experts(4, 64, 64, g)
    assert torch.equal(dequantize_mxfp4_triton(ex.gate_up_blocks, ex.gate_up_scales, torch.float32),
                       dequantize_mxfp4(ex.gate_up_blocks, ex.gate_up_scales))
    x = torch.randn(40, 64, generator=g)
    w, ids = routing(40, 4, 2, g, "one")
    ref = moe_reference(x, w, ids, ex, 7.0)
    assert ((moe_prefill_dense(x, w, ids, ex, 7.0) - ref).norm() / ref.norm()).item() < 1e-5


@pytest.mark.parametrize("t", [1, 3])
def test_gemv_decode_path_matches_reference(t: int) -> None:
    from osserve.ops.moe_triton import fused_moe_gemv

    g = torch.Generator().manual_seed(11 + t)
    ex = random_experts(8, 64, 96, g)  # 96: a K chunk that is not a whole BLOCK_K
    x = torch.randn(t, 64, generator=g)
    w, ids = routing(t, 8, 4, g, "none")
    ref = moe_reference(x, w, ids, ex, 7.0)
    out = fused_moe_gemv(x, w, ids, ex, 7.0, bn=32, bk=64)
    assert ((out - ref).norm() / ref.norm()).item() < 1e-5
