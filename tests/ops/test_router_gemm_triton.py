"""The fused small-batch router (logits GEMM + top-k + softmax in one kernel) against
`route_reference` (TRITON_INTERPRET=1, CPU, float32, small odd shapes), H split or not."""

from __future__ import annotations

import pytest
import torch

from osserve.ops.moe.plan import align_tokens
from osserve.ops.norm.norm_triton import add_rms_norm_triton
from osserve.ops.norm.reference import add_rms_norm_reference
from osserve.ops.router.counters import router_counters
from osserve.ops.router.dispatch import add_norm_route_with_plan, route_with_plan
from osserve.ops.router.fused_triton import (
    NormInput,
    fits_fused_router,
    fits_router_norm,
    fits_router_plan,
    router_gemm_topk_triton,
    router_norm_plan_triton,
    router_plan_triton,
)
from osserve.ops.router.reference import route_reference
from tests.ops.moe_fixtures import plan_tiles


def tie_free_case(t: int, h: int, e: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x, weight, bias whose top-5 logits are well apart on every row, so only one answer is
    right and fp32 summation order cannot change it."""
    for s in range(seed, seed + 100):
        g = torch.Generator().manual_seed(s)
        x = torch.randn(t, h, generator=g)
        w = torch.randn(e, h, generator=g) / h**0.5
        b = torch.randn(e, generator=g)
        top = torch.nn.functional.linear(x, w, b).topk(5, dim=-1).values
        if (top[:, :-1] - top[:, 1:] > 1e-4).all():
            return x, w, b
    pytest.fail("no tie-free draw")


@pytest.mark.parametrize("t", [1, 3, 17])
@pytest.mark.parametrize("e", [8, 32])
@pytest.mark.parametrize(("h", "split"), [(64, None), (128, None), (128, 1), (320, 3), (320, 5)])
def test_fused_router_matches_reference(t: int, e: int, h: int, split: int | None) -> None:
    x, w, b = tie_free_case(t, h, e, seed=t * e + h)
    counters = router_counters("cpu")
    ref_w, ref_ids = route_reference(x, w, b, 4)
    weights, ids = router_gemm_topk_triton(x, w, b, 4, counters, split)
    assert ids.dtype == torch.int64 and torch.equal(ids, ref_ids)
    assert weights.dtype == x.dtype and (weights - ref_w).abs().max().item() < 1e-5
    assert not counters.any()  # the last program of each token block reset its counter
    again_w, again_ids = router_gemm_topk_triton(x, w, b, 4, counters, split)
    assert torch.equal(again_ids, ids) and torch.equal(again_w, weights)  # deterministic


def test_fused_router_strided_x_and_no_counters() -> None:
    """x may be a row-strided view; without counters the kernel makes its own."""
    x, w, b = tie_free_case(5, 192, 16, seed=7)
    wide = torch.zeros(5, 300)
    wide[:, 10:202] = x
    weights, ids = router_gemm_topk_triton(wide[:, 10:202], w, b, 2, None, split=3)
    ref_w, ref_ids = route_reference(x, w, b, 2)
    assert torch.equal(ids, ref_ids) and (weights - ref_w).abs().max().item() < 1e-5


def test_fused_router_ties_lower_index_first() -> None:
    x = torch.ones(2, 64)
    w = torch.zeros(8, 64)  # logits = bias
    b = torch.tensor([1.0, 3.0, 3.0, 0.0, 3.0, -1.0, 2.0, 3.0])
    weights, ids = router_gemm_topk_triton(x, w, b, 4, router_counters("cpu"), split=1)
    assert ids.tolist() == [[1, 2, 4, 7]] * 2
    assert torch.allclose(weights, torch.full((2, 4), 0.25))


def plan_rows(plan) -> tuple[list[int], list[int], int]:  # noqa: ANN001
    """A plan's contents in use: sorted slots (padding included) up to num_padded, tile experts."""
    used = int(plan.num_padded.item())
    return plan.sorted_slots[:used].tolist(), plan.block_expert.tolist(), used


@pytest.mark.parametrize("t", [1, 3, 16])
@pytest.mark.parametrize(("e", "split", "block_m"), [(8, None, 16), (32, 3, 16), (32, 1, 4), (128, 5, 8)])
def test_router_builds_the_routing_plan(t: int, e: int, split: int | None, block_m: int) -> None:
    """At one token block the router's last program also builds the MoE's routing plan: the same
    plan align_tokens builds from the same ids, with or without an H split."""
    x, w, b = tie_free_case(t, 320, e, seed=t + e)
    counters = router_counters("cpu")
    weights, ids, plan = router_plan_triton(x, w, b, 4, counters, block_m, split)
    ref_w, ref_ids = router_gemm_topk_triton(x, w, b, 4, counters, split)
    assert torch.equal(ids, ref_ids) and torch.equal(weights, ref_w) and not counters.any()
    expected = align_tokens(ids, e, block_m)
    assert plan.block_m == block_m and plan.max_blocks == expected.max_blocks
    assert plan.sorted_slots.shape == expected.sorted_slots.shape
    assert plan_tiles(plan) == plan_tiles(expected)
    if t == 1 and split != 1:  # the last of several programs (moe_align.plan_one_token): tile j holds slot j
        rows = torch.arange(4 * block_m)
        assert plan.block_expert.tolist() == ids[0].tolist()
        assert torch.equal(plan.sorted_slots, torch.where(rows % block_m == 0, rows // block_m, 4).int())
    else:  # build_plan (one program, or more tokens): align_tokens' plan, the padding past num_padded too
        assert torch.equal(plan.sorted_slots, expected.sorted_slots) and plan_rows(plan) == plan_rows(expected)


@pytest.mark.parametrize("t", [1, 3, 4])
@pytest.mark.parametrize(("parts", "split"), [(0, None), (2, 3), (3, 1)])
def test_router_takes_the_post_attention_norm(t: int, parts: int, split: int | None) -> None:
    """router_norm_plan_triton = the add + RMSNorm kernel, then router_plan_triton on its rows: the
    same new residual, normed rows, routing and plan, from [T, H] or unreduced [S, T, 1, H] input
    (parts = S), with or without an H split."""
    h, e = 320, 16
    x, w, b = tie_free_case(t, h, e, seed=11 * t + parts)
    g = torch.Generator().manual_seed(t + parts)
    residual = torch.randn(t, h, generator=g)
    norm_weight = 1 + torch.rand(h, generator=g)
    # the attention output that, added to the residual and normed, gives rows near x's scale
    a = x - residual if not parts else torch.randn(parts, t, 1, h, generator=g) / parts
    norm = NormInput(a, residual.clone(), norm_weight, 1e-5)
    counters = router_counters("cpu")
    got_x, got_res, weights, ids, plan = router_norm_plan_triton(norm, w, b, 4, counters, 16, split)
    ref_x, ref_res = add_rms_norm_triton(a, residual, norm_weight, 1e-5)
    assert torch.equal(got_res, ref_res) and torch.equal(residual, norm.residual)  # the residual is left alone
    assert torch.allclose(got_x, ref_x, rtol=1e-6, atol=1e-6)
    assert torch.allclose(got_x, add_rms_norm_reference(a, residual, norm_weight, 1e-5)[0], rtol=1e-5, atol=1e-5)
    ref_w, ref_ids, ref_plan = router_plan_triton(ref_x, w, b, 4, router_counters("cpu"), 16, split)
    assert torch.equal(ids, ref_ids) and (weights - ref_w).abs().max().item() < 1e-5 and not counters.any()
    assert plan_rows(plan) == plan_rows(ref_plan)


def test_add_norm_route_with_plan_on_cpu_is_the_reference_pair() -> None:
    x, w, b = tie_free_case(2, 64, 8, seed=5)
    residual, norm_weight = torch.randn(2, 64), torch.rand(64)
    normed, summed, weights, ids, plan = add_norm_route_with_plan(x, residual, norm_weight, 1e-5, w, b, 4,
                                                                  router_counters("cpu"), 16)
    ref_x, ref_res = add_rms_norm_reference(x, residual, norm_weight, 1e-5)
    ref_w, ref_ids = route_reference(ref_x, w, b, 4)
    assert plan is None and torch.equal(normed, ref_x) and torch.equal(summed, ref_res)
    assert torch.equal(ids, ref_ids) and torch.equal(weights, ref_w)
    assert fits_router_norm(4) and not fits_router_norm(5) and not fits_router_norm(0)


def test_route_with_plan_on_cpu_is_route_reference_without_plan() -> None:
    x, w, b = tie_free_case(2, 64, 8, seed=3)
    weights, ids, plan = route_with_plan(x, w, b, 4, router_counters("cpu"), 16)
    ref_w, ref_ids = route_reference(x, w, b, 4)
    assert plan is None and torch.equal(ids, ref_ids) and torch.equal(weights, ref_w)
    assert fits_router_plan(16) and not fits_router_plan(17) and not fits_router_plan(0)


def test_fits_fused_router() -> None:
    assert fits_fused_router(1, 32, 4) and fits_fused_router(128, 128, 4)
    assert not fits_fused_router(129, 32, 4)
    assert not fits_fused_router(1, 512, 4)
    assert not fits_fused_router(1, 32, 3)
