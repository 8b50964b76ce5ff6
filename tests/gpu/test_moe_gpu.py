"""The fused MXFP4 MoE kernels at gpt-oss-20b shapes on the GPU, bf16 against a float32 reference:
the token-tiled kernel (moe/tiled.py), the weights-as-left-operand ones (moe/swapped.py in Triton,
moe/gluon.py in Gluon on Hopper), their K split forced on and off."""

from __future__ import annotations

import pytest
import torch

from osserve.ops.moe import gluon as moe_gluon
from osserve.ops.moe.layout import prepare_mxfp4_experts
from osserve.ops.moe.reference import moe_reference
from osserve.ops.moe.swapped import fused_moe_swapped
from osserve.ops.moe.tiled import fused_moe_triton
from tests.ops.moe_fixtures import random_experts, random_routing

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

HIDDEN = INTER = 2880
EXPERTS, TOP_K, LIMIT = 32, 4, 7.0


@pytest.fixture(scope="module")
def layer():
    experts = random_experts(EXPERTS, HIDDEN, INTER, device="cuda")
    return experts, prepare_mxfp4_experts(experts)


hopper = pytest.mark.skipif(not torch.cuda.is_available() or not moe_gluon.supported(torch.device("cuda"), 64, 64),
                            reason="the Hopper kernel policy (sm_90, not OSSERVE_PORTABLE_KERNELS=1)")


@pytest.fixture(scope="module")
def fragments(layer):
    return prepare_mxfp4_experts(layer[0], fragments=True)


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize(
    "num_tokens,mode",
    [(1, "uniform"), (2, "uniform"), (7, "uniform"), (7, "sparse"), (64, "uniform"), (64, "skewed"),
     (300, "uniform"), (300, "sparse"), (4096, "uniform"), (4096, "skewed")],
)
@pytest.mark.parametrize("kernel", ["token-tiled", "swapped", "swapped-no-split", "swapped-max-split"])
def test_matches_float32_reference(layer, num_tokens: int, mode: str, kernel: str) -> None:
    experts, prepared = layer
    x = torch.randn(num_tokens, HIDDEN, device="cuda").bfloat16()
    weights, ids = random_routing(num_tokens, EXPERTS, TOP_K, mode, device="cuda")
    ref = moe_reference(x.float(), weights, ids, experts, LIMIT)
    if kernel == "token-tiled":
        out = fused_moe_triton(x, weights.bfloat16(), ids, prepared, LIMIT)
    else:
        min_programs = {"swapped": None, "swapped-no-split": 1, "swapped-max-split": 10**6}[kernel]
        out = fused_moe_swapped(x, weights.bfloat16(), ids, prepared, LIMIT, min_programs=min_programs)
    assert out.dtype == torch.bfloat16 and out.shape == (num_tokens, HIDDEN)
    assert torch.isfinite(out).all()
    assert _rel_err(out, ref) < 1e-2


@hopper
@pytest.mark.parametrize(
    "num_tokens,mode",
    [(1, "uniform"), (2, "uniform"), (7, "uniform"), (7, "sparse"), (64, "uniform"), (64, "skewed"),
     (300, "uniform"), (300, "sparse"), (4096, "uniform"), (4096, "skewed"), (5000, "uniform")],
)
@pytest.mark.parametrize("variant", ["default", "split", "max-split", "tile-8", "tile-16", "tile-32", "tile-64",
                                     "ring-2", "tile-16-ring-3", "tile-32-ring-4", "one-row-tile", "two-row-tiles",
                                     "one-row-tile-max-split", "down-unsplit", "down-max-split", "no-copy-warp",
                                     "copy-warp-tile-32", "copy-warp-ring-2", "copy-warp-max-split", "ragged-64",
                                     "ragged-64-one-row-tile", "ragged-64-split", "ragged-32", "plain-64",
                                     "down-two-tiles-16-split", "down-two-tiles-32", "down-two-tiles-ragged-32",
                                     "down-two-tiles-64"])
def test_gluon_matches_float32_reference(layer, fragments, num_tokens: int, mode: str, variant: str) -> None:
    """K = 2880 ends on a 64-column tail step; 5000 tokens run as two chunks. The variants: K split
    (to 2 programs per SM, and to the most), each token tile, shared-memory rings of 2-4 steps, one
    or two 64-row gate/up tiles per program, the down GEMM's K split alone, the K loops with and
    without a copy warp (moe/gluon_ws.py), ragged token tiles (an expert's last tile at half its rows
    where its second half is empty) and plain ones, and two 64-row down tiles a program (hidden's 45
    tiles: the last program's second tile repeats its first and stores nothing)."""
    experts, _ = layer
    x = torch.randn(num_tokens, HIDDEN, device="cuda").bfloat16()
    weights, ids = random_routing(num_tokens, EXPERTS, TOP_K, mode, device="cuda")
    ref = moe_reference(x.float(), weights, ids, experts, LIMIT)
    kwargs = {"default": {}, "split": {"min_programs": 264}, "max-split": {"min_programs": 10**6},
              "tile-8": {"block_t": 8}, "tile-16": {"block_t": 16}, "tile-32": {"block_t": 32},
              "tile-64": {"block_t": 64},
              "ring-2": {"stages": 2}, "tile-16-ring-3": {"block_t": 16, "stages": 3},
              "tile-32-ring-4": {"block_t": 32, "stages": 4}, "one-row-tile": {"gate_up_tiles": 1},
              "two-row-tiles": {"gate_up_tiles": 2},
              "one-row-tile-max-split": {"gate_up_tiles": 1, "min_programs": 10**6},
              "down-unsplit": {"down_min_programs": 1}, "down-max-split": {"down_min_programs": 10**6},
              "no-copy-warp": {"ws": False}, "copy-warp-tile-32": {"block_t": 32, "gate_up_tiles": 1, "ws": True},
              "copy-warp-ring-2": {"ws": True, "stages": 2},
              "copy-warp-max-split": {"ws": True, "min_programs": 10**6, "down_min_programs": 10**6},
              "ragged-64": {"block_t": 64, "ragged": True},
              "ragged-64-one-row-tile": {"block_t": 64, "ragged": True, "gate_up_tiles": 1},
              "ragged-64-split": {"block_t": 64, "ragged": True, "min_programs": 10**6, "down_min_programs": 10**6},
              "ragged-32": {"block_t": 32, "ragged": True, "ws": False},
              "plain-64": {"block_t": 64, "ragged": False},
              "down-two-tiles-16-split": {"block_t": 16, "down_tiles": 2, "ws": False, "down_min_programs": 10**6},
              "down-two-tiles-32": {"block_t": 32, "down_tiles": 2, "ragged": False, "ws": False},
              "down-two-tiles-ragged-32": {"block_t": 32, "down_tiles": 2, "ragged": True, "ws": False},
              "down-two-tiles-64": {"block_t": 64, "down_tiles": 2}}[variant]
    out = moe_gluon.fused_moe_gluon(x, weights.bfloat16(), ids, fragments, LIMIT, **kwargs)
    assert out.dtype == torch.bfloat16 and out.shape == (num_tokens, HIDDEN)
    assert torch.isfinite(out).all()
    assert _rel_err(out, ref) < 1e-2


@hopper
@pytest.mark.parametrize("num_tokens", [1, 7, 300])
def test_gluon_unreduced_output_sums_in_the_norm(layer, fragments, num_tokens: int) -> None:
    """reduce=False (the model's call) leaves [S, T, k, H] for add_rms_norm to sum: the same residual,
    bit for bit, as summing in the MoE, and the same normed rows at the same warps per row (the
    norm's sum of squares is reduced across the warps, so its rounding depends on their number; at
    its default, more warps for unreduced rows, within a bf16 rounding). Batch 1 splits the down
    GEMM (S = 2)."""
    from osserve.ops.norm.norm_triton import add_rms_norm_triton, default_warps

    x = torch.randn(num_tokens, HIDDEN, device="cuda").bfloat16()
    res = torch.randn(num_tokens, HIDDEN, device="cuda").bfloat16()
    norm_weight = torch.randn(HIDDEN, device="cuda").bfloat16()
    weights, ids = random_routing(num_tokens, EXPERTS, TOP_K, "uniform", device="cuda")
    summed = moe_gluon.fused_moe_gluon(x, weights.bfloat16(), ids, fragments, LIMIT)
    parts = moe_gluon.fused_moe_gluon(x, weights.bfloat16(), ids, fragments, LIMIT, reduce=False)
    assert parts.shape[1:] == (num_tokens, TOP_K, HIDDEN) and (num_tokens > 1 or parts.shape[0] > 1)
    out, new_res = add_rms_norm_triton(parts, res, norm_weight, 1e-5)
    warps = default_warps(HIDDEN, parts.shape[0] * TOP_K)
    ref_out, ref_res = add_rms_norm_triton(summed, res, norm_weight, 1e-5, num_warps=warps)
    assert torch.equal(new_res, ref_res) and torch.equal(out, ref_out)
    default_out, _ = add_rms_norm_triton(summed, res, norm_weight, 1e-5)
    torch.testing.assert_close(out, default_out, rtol=2**-7, atol=1e-6)


@hopper
@pytest.mark.parametrize("num_tokens", [1, 3])
def test_gluon_takes_the_routers_plan(layer, fragments, num_tokens: int) -> None:
    """fused_moe with the plan the router's kernel built (one token's tiles in slot order,
    moe_align.plan_one_token; build_plan's above) gives the rows, bit for bit, of the plan the MoE
    builds itself (align_tokens: expert order)."""
    from dataclasses import replace

    from osserve.ops.moe.dispatch import fused_moe, plan_block_m
    from osserve.ops.router.counters import router_counters
    from osserve.ops.router.dispatch import route_with_plan

    experts = replace(layer[0], prepared=fragments)
    x = torch.randn(num_tokens, HIDDEN, device="cuda").bfloat16()
    w = (torch.randn(EXPERTS, HIDDEN, device="cuda") / HIDDEN**0.5).bfloat16()
    b = torch.randn(EXPERTS, device="cuda").bfloat16()
    block_m = plan_block_m(experts, num_tokens, TOP_K)
    weights, ids, plan = route_with_plan(x, w, b, TOP_K, router_counters("cuda"), block_m)
    assert plan is not None
    own = fused_moe(x, weights, ids, experts, LIMIT, reduce=False)
    with_plan = fused_moe(x, weights, ids, experts, LIMIT, reduce=False, plan=plan)
    assert torch.equal(with_plan, own)


@hopper
@pytest.mark.parametrize("num_tokens,block_t", [(1, None), (7, None), (300, None), (300, 16), (300, 32),
                                                (1024, None)])
def test_gluon_is_deterministic(layer, fragments, num_tokens: int, block_t: int | None) -> None:
    """The same call gives the same rows, bit for bit (CUDA-graph replays and greedy decoding rely on
    it; a race in the shared-memory ring would show here first)."""
    x = torch.randn(num_tokens, HIDDEN, device="cuda").bfloat16()
    weights, ids = random_routing(num_tokens, EXPERTS, TOP_K, "uniform", device="cuda")
    first = moe_gluon.fused_moe_gluon(x, weights.bfloat16(), ids, fragments, LIMIT, block_t, reduce=False)
    for _ in range(5):
        again = moe_gluon.fused_moe_gluon(x, weights.bfloat16(), ids, fragments, LIMIT, block_t, reduce=False)
        differ = again != first  # [S, T, k, H]
        assert not differ.any(), (f"{differ.sum().item()} values differ, in (split, token, k) "
                                  f"{differ.any(-1).nonzero()[:6].tolist()}, columns "
                                  f"{differ.any(0).any(0).any(0).nonzero().flatten()[:12].tolist()}")


@hopper
def test_gluon_small_shapes() -> None:
    """Another shape: gate/up K = 256 (whole 128-column steps, no tail), down K = 320 (a tail)."""
    experts = random_experts(8, 256, 320, device="cuda")
    prepared = prepare_mxfp4_experts(experts, fragments=True)
    x = torch.randn(33, 256, device="cuda").bfloat16()
    weights, ids = random_routing(33, 8, TOP_K, device="cuda")
    ref = moe_reference(x.float(), weights, ids, experts, LIMIT)
    for stages in (2, 3, 4):
        for tiles in (1, 2):
            out = moe_gluon.fused_moe_gluon(x, weights.bfloat16(), ids, prepared, LIMIT, stages=stages,
                                            gate_up_tiles=tiles)
            assert _rel_err(out, ref) < 1e-2, (stages, tiles)
        for bt in (8, 16):  # the copy warp's loops (moe/gluon_ws.py)
            out = moe_gluon.fused_moe_gluon(x, weights.bfloat16(), ids, prepared, LIMIT, bt, stages=stages, ws=True)
            assert _rel_err(out, ref) < 1e-2, (stages, bt)


@pytest.mark.parametrize("num_tokens,mode", [(600, "uniform"), (3000, "skewed"), (3000, "sparse")])
def test_dense_prefill_path_matches_float32_reference(layer, num_tokens: int, mode: str) -> None:
    """Whole prompts: the layer dequantised once, grouped GEMMs, the one-pass SwiGLU and combine
    kernels; inside a CUDA graph too (no host read)."""
    from osserve.ops.moe.dense import moe_prefill_dense

    experts, _ = layer
    x = torch.randn(num_tokens, HIDDEN, device="cuda").bfloat16()
    weights, ids = random_routing(num_tokens, EXPERTS, TOP_K, mode, device="cuda")
    ref = moe_reference(x.float(), weights, ids, experts, LIMIT)
    out = moe_prefill_dense(x, weights.bfloat16(), ids, experts, LIMIT)
    assert out.dtype == torch.bfloat16 and out.shape == (num_tokens, HIDDEN)
    assert _rel_err(out, ref) < 1e-2
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = moe_prefill_dense(x, weights.bfloat16(), ids, experts, LIMIT)
    graph.replay()
    assert torch.equal(captured, out)


@hopper
def test_inline_ptx_dequant_path(layer) -> None:
    """The opt-in inline-PTX dequantiser computes the same function (sm_90 PTX: the Hopper policy only)."""
    experts, prepared = layer
    x = torch.randn(7, HIDDEN, device="cuda").bfloat16()
    weights, ids = random_routing(7, EXPERTS, TOP_K, device="cuda")
    ref = moe_reference(x.float(), weights, ids, experts, LIMIT)
    assert _rel_err(fused_moe_triton(x, weights, ids, prepared, LIMIT, fast_dequant=True), ref) < 1e-2


@pytest.mark.parametrize("moe", [fused_moe_triton, fused_moe_swapped, moe_gluon.fused_moe_gluon],
                         ids=["token-tiled", "swapped", "gluon"])
@pytest.mark.parametrize("num_tokens", [1, 8])
def test_cuda_graph_replay(layer, fragments, moe, num_tokens: int) -> None:
    """The decode path captures into a CUDA graph (no host sync) and replays on fresh inputs."""
    if moe is moe_gluon.fused_moe_gluon and not moe_gluon.supported(torch.device("cuda"), 64, 64):
        pytest.skip("the Gluon kernel needs the Hopper kernel policy (sm_90, not OSSERVE_PORTABLE_KERNELS=1)")
    experts, prepared = layer
    prepared = fragments if moe is moe_gluon.fused_moe_gluon else prepared
    x = torch.randn(num_tokens, HIDDEN, device="cuda").bfloat16()
    weights, ids = random_routing(num_tokens, EXPERTS, TOP_K, device="cuda")
    moe(x, weights, ids, prepared, LIMIT)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe(x, weights, ids, prepared, LIMIT)
    for mode in ("uniform", "skewed"):
        new_w, new_ids = random_routing(num_tokens, EXPERTS, TOP_K, mode, device="cuda")
        x.copy_(torch.randn_like(x))
        weights.copy_(new_w)
        ids.copy_(new_ids)
        graph.replay()
        ref = moe_reference(x.float(), weights, ids, experts, LIMIT)
        assert _rel_err(out, ref) < 1e-2
