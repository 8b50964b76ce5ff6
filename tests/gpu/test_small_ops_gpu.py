"""Norm, RoPE + KV-cache write and router kernels (top-k; the fused small-batch GEMM + top-k) vs
their references at gpt-oss shapes on CUDA (H 2880; 64 q / 8 kv heads, head_dim 64, block 16;
E 32 and 128, top-4; T up to 8192), bf16."""

from __future__ import annotations

import pytest
import torch

from osserve.config import YarnRope
from osserve.ops.moe.plan import align_tokens
from osserve.ops.norm.norm_triton import add_rms_norm_triton
from osserve.ops.norm.reference import add_rms_norm_reference, rms_norm_reference
from osserve.ops.rope.reference import RopeTable, rope_and_cache_reference, rope_and_cache_table_reference
from osserve.ops.rope.rope_triton import rope_and_cache_triton
from osserve.ops.router.counters import router_counters
from osserve.ops.router.dispatch import add_norm_route_with_plan, route, route_with_plan
from osserve.ops.router.fused_triton import router_gemm_topk_triton
from osserve.ops.router.reference import route_reference
from osserve.ops.router.topk_triton import route_triton
from tests.ops.moe_fixtures import plan_tiles

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, BLOCK = 2880, 64, 8, 64, 16
TOKENS = [1, 3, 32, 1000, 8192]
POISON = -12345.0


def rel_close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-2) -> None:
    assert a.shape == b.shape and not a.isnan().any()
    err = (a.float() - b.float()).abs().max().item()
    assert err <= tol * max(b.float().abs().max().item(), 1.0), err


@pytest.mark.parametrize("t", TOKENS)
def test_norms_gpu(t: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(t)
    x = (torch.randn(t, HIDDEN, device="cuda", generator=g) * 3).bfloat16()
    res = torch.randn(t, HIDDEN, device="cuda", generator=g).bfloat16()
    w = torch.randn(HIDDEN, device="cuda", generator=g).bfloat16()
    out, summed = add_rms_norm_triton(x, res, w, 1e-5)
    ref_out, ref_sum = add_rms_norm_reference(x, res, w, 1e-5)
    assert torch.equal(summed, ref_sum)  # both round the fp32 sum to nearest bf16
    rel_close(out, ref_out)
    rel_close(add_rms_norm_triton(x, None, w, 1e-5)[0], rms_norm_reference(x, w, 1e-5))
    r = res.clone()
    out2, summed2 = add_rms_norm_triton(x, r, w, 1e-5, inplace=True)
    assert summed2 is r and torch.equal(r, ref_sum) and torch.equal(out2, out)


@pytest.mark.parametrize("t", [1, 3, 300])
@pytest.mark.parametrize("splits", [1, 2])
def test_add_rms_norm_of_unreduced_moe_rows_gpu(t: int, splits: int) -> None:
    """x as the MoE leaves it, [S, T, k, H] (bf16 rows, or float32 K-split partials): the residual
    is bit for bit the float32 sum, splits outer and experts inner, rounded once, plus the residual."""
    g = torch.Generator(device="cuda").manual_seed(t + splits)
    dtype = torch.float32 if splits > 1 else torch.bfloat16
    parts = torch.randn(splits, t, 4, HIDDEN, device="cuda", generator=g).to(dtype)
    res = torch.randn(t, HIDDEN, device="cuda", generator=g).bfloat16()
    w = torch.randn(HIDDEN, device="cuda", generator=g).bfloat16()
    out, summed = add_rms_norm_triton(parts, res, w, 1e-5)
    in_order = torch.zeros(t, HIDDEN, device="cuda")
    for s in range(splits):
        for j in range(4):
            in_order += parts[s, :, j].float()
    assert torch.equal(summed, in_order.bfloat16() + res)
    ref_out, ref_sum = add_rms_norm_reference(parts, res, w, 1e-5)
    rel_close(summed, ref_sum)
    rel_close(out, ref_out)


@pytest.mark.parametrize("t", TOKENS)
@pytest.mark.parametrize("use_table", [False, True])
def test_rope_and_cache_gpu(t: int, use_table: bool) -> None:
    g = torch.Generator(device="cuda").manual_seed(t)
    q = torch.randn(t, HEADS, HEAD_DIM, device="cuda", generator=g).bfloat16()
    k = torch.randn(t, KV_HEADS, HEAD_DIM, device="cuda", generator=g).bfloat16()
    v = torch.randn(t, KV_HEADS, HEAD_DIM, device="cuda", generator=g).bfloat16()
    num_blocks = t // BLOCK + 8
    table = RopeTable.build(YarnRope(), HEAD_DIM, 131072, "cuda")
    positions = torch.randint(0, 131072, (t,), device="cuda", generator=g)
    slots = torch.randperm(num_blocks * BLOCK, device="cuda", generator=g)[:t]
    slots[::7] = -1
    cache = torch.full((num_blocks, BLOCK, KV_HEADS, HEAD_DIM), POISON, device="cuda").bfloat16()
    kc_ref, vc_ref, kc, vc = cache.clone(), cache.clone(), cache.clone(), cache.clone()
    q_ref, k_ref = rope_and_cache_table_reference(q, k, v, positions, table, kc_ref, vc_ref, slots)
    q32, k32 = rope_and_cache_table_reference(q.float(), k.float(), v.float(), positions, table,
                                              kc_ref.float(), vc_ref.float(), slots)
    if use_table:
        qo, ko = rope_and_cache_triton(q, k, v, table.cos, table.sin, kc, vc, slots, positions=positions)
    else:
        cos, sin = table.cos[positions], table.sin[positions]
        qo, ko = rope_and_cache_triton(q, k, v, cos, sin, kc, vc, slots)
    # The kernel rotates in fp32 and rounds once: within half a bf16 ulp of the fp32 reference.
    # The bf16 reference rounds after each op (up to ~1.5 ulp), so the two may differ by 2 ulps
    # (2^-7 of the value): hence 2e-2 against it.
    rel_close(qo, q32, 6e-3)
    rel_close(ko, k32, 6e-3)
    rel_close(qo, q_ref, 2e-2)
    rel_close(ko, k_ref, 2e-2)
    assert torch.equal(vc, vc_ref)
    stored = slots >= 0
    flat = kc.view(-1, KV_HEADS, HEAD_DIM)
    assert torch.equal(flat[slots[stored]], ko[stored])
    untouched = torch.ones(flat.shape[0], dtype=torch.bool, device="cuda")
    untouched[slots[stored]] = False
    assert (flat[untouched] == POISON).all()
    # The per-step contract agrees too.
    kc2, vc2 = cache.clone(), cache.clone()
    q2, _ = rope_and_cache_reference(q, k, v, table.cos[positions], table.sin[positions], kc2, vc2, slots)
    assert torch.equal(q2, q_ref) and torch.equal(kc2, kc_ref)


@pytest.mark.parametrize("t", TOKENS)
@pytest.mark.parametrize("e", [32, 128])
def test_router_gpu(t: int, e: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(t + e)
    x = torch.randn(t, HIDDEN, device="cuda", generator=g).bfloat16()
    w = (torch.randn(e, HIDDEN, device="cuda", generator=g) / HIDDEN**0.5).bfloat16()
    b = torch.randn(e, device="cuda", generator=g).bfloat16()
    weights, ids = route_triton(x, w, b, 4)
    ref_w, ref_ids = route_reference(x, w, b, 4)
    logits = torch.nn.functional.linear(x, w, b)
    # bf16 logits tie now and then (and torch.topk on CUDA orders ties as it likes): the chosen
    # logits must be the top-4 values in order everywhere; the ids must match on tie-free rows.
    assert torch.equal(logits.gather(1, ids), logits.gather(1, ref_ids))
    top5 = logits.float().topk(5, dim=-1).values
    tie_free = (top5[:, :-1] > top5[:, 1:]).all(dim=1)
    assert torch.equal(ids[tie_free], ref_ids[tie_free])
    assert (ids.sort(dim=1).values.diff(dim=1) > 0).all()  # no expert chosen twice
    rel_close(weights, ref_w)


@pytest.mark.parametrize("t", [1, 2, 7, 64, 128])
@pytest.mark.parametrize("e", [32, 128])
@pytest.mark.parametrize("split", [None, 1, 7])
def test_fused_router_gpu(t: int, e: int, split: int | None) -> None:
    """The one-launch router (logits + top-k + softmax) against route_reference in fp32."""
    g = torch.Generator(device="cuda").manual_seed(t * e)
    x = torch.randn(t, HIDDEN, device="cuda", generator=g).bfloat16()
    w = (torch.randn(e, HIDDEN, device="cuda", generator=g) / HIDDEN**0.5).bfloat16()
    b = torch.randn(e, device="cuda", generator=g).bfloat16()
    counters = router_counters("cuda")
    weights, ids = router_gemm_topk_triton(x, w, b, 4, counters, split)
    assert not counters.any()  # reset by each token block's last program
    again_w, again_ids = router_gemm_topk_triton(x, w, b, 4, counters, split)
    assert torch.equal(again_ids, ids) and torch.equal(again_w, weights)  # deterministic
    ref_w, ref_ids = route_reference(x.float(), w.float(), b.float(), 4)
    logits = torch.nn.functional.linear(x.float(), w.float(), b.float())
    # The kernel rounds its fp32 logits to bf16 before the top-k (as F.linear's bf16 output is):
    # the logits it picks are the fp32 top-4 up to that rounding, and the ids match wherever
    # the fp32 top-5 are further apart than a bf16 ulp.
    picked, best = logits.gather(1, ids), logits.gather(1, ref_ids)
    assert ((picked - best).abs() <= 2**-7 * best.abs() + 1e-3).all()
    top5 = logits.topk(5, dim=-1).values
    tie_free = ((top5[:, :-1] - top5[:, 1:]) > 2**-7 * top5[:, :-1].abs() + 1e-4).all(dim=1)
    assert tie_free.sum() >= t // 4
    assert torch.equal(ids[tie_free], ref_ids[tie_free])
    assert (ids.sort(dim=1).values.diff(dim=1) > 0).all()  # no expert chosen twice
    rel_close(weights[tie_free], ref_w[tie_free].bfloat16(), 2e-2)
    if split is None:  # `route` takes this path, with this split, for T <= 128 on CUDA
        routed_w, routed_ids = route(x, w, b, 4, counters)
        assert torch.equal(routed_ids, ids) and torch.equal(routed_w, weights)


@pytest.mark.parametrize("t", [1, 2, 17, 32])
@pytest.mark.parametrize(("n", "k"), [(HEADS * HEAD_DIM + 2 * KV_HEADS * HEAD_DIM, HIDDEN),
                                      (HIDDEN, HEADS * HEAD_DIM), (201088, HIDDEN)])
def test_small_m_linear_matches_f_linear(t: int, n: int, k: int) -> None:
    """The decode projections (fused qkv, o, lm_head) in bf16 against F.linear in float32."""
    from osserve.ops.linear.dispatch import linear
    from osserve.ops.linear.small_m_triton import small_m_linear_triton

    g = torch.Generator(device="cuda").manual_seed(t + n)
    x = torch.randn(t, k, device="cuda", generator=g).bfloat16()
    w = (torch.randn(n, k, device="cuda", generator=g) / k**0.5).bfloat16()
    b = torch.randn(n, device="cuda", generator=g).bfloat16()
    ref = torch.nn.functional.linear(x.float(), w.float(), b.float())
    out = small_m_linear_triton(x, w, b)
    assert out.dtype == torch.bfloat16
    assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2
    assert torch.equal(linear(x, w, b), out)  # the dispatcher takes the kernel at decode sizes
    parts = linear(x, w, b, reduce=False)  # K split where the row blocks leave SMs idle: o only (2)
    if n != HIDDEN:
        assert torch.equal(parts, out)
    else:
        assert parts.shape == (2, t, 1, n) and parts.dtype == torch.float32
        assert ((parts.sum((0, 2)) - ref).norm() / ref.norm()).item() < 1e-4


@pytest.mark.parametrize("t", [1, 2, 17, 32])
def test_logits_and_greedy_on_the_real_vocab(t: int) -> None:
    """The head's fused kernel (ops/linear/head_triton.py) at gpt-oss's lm_head: with the small-M linear's
    config its float32 logits are bit for bit that kernel's bf16 output cast up; with its own
    one-token config (another K order) within a bf16 rounding of them and exactly bf16 values; its greedy
    ids are torch.argmax's, ties included (rows 5 and 150,001 duplicated; token 0 prefers them)."""
    from osserve.ops.linear.head_triton import logits_and_greedy_triton
    from osserve.ops.linear.small_m_triton import DEFAULT_CONFIG, small_m_linear_triton

    g = torch.Generator(device="cuda").manual_seed(t)
    x = torch.randn(t, HIDDEN, device="cuda", generator=g).bfloat16()
    w = (torch.randn(201088, HIDDEN, device="cuda", generator=g) / HIDDEN**0.5).bfloat16()
    w[5] = w[150_001] = x[0] / x[0].float().norm()
    ref = small_m_linear_triton(x, w, None).float()
    assert torch.equal(logits_and_greedy_triton(x, w, DEFAULT_CONFIG)[0], ref)
    logits, greedy = logits_and_greedy_triton(x, w)
    assert torch.equal(logits, logits.bfloat16().float())
    assert ((logits - ref).abs() <= ref.abs() / 128 + 1e-4).all()  # a bf16 ulp, or fp32 sums near 0
    assert torch.equal(greedy, logits.argmax(-1))
    assert greedy[0].item() == 5


def test_fused_sampler_on_the_real_vocab() -> None:
    """The Sampler's fused path (temperature only) at gpt-oss's vocab: draws follow the tempered
    softmax, and a seeded row draws the same token alone and in a batch."""
    from osserve.engine.core.sampling_params import SamplingParams
    from osserve.engine.worker.sampler import Sampler, SamplingBatch

    vocab, n = 201088, 4000
    g = torch.Generator(device="cuda").manual_seed(0)
    z = torch.full((vocab,), -30.0, device="cuda")
    z[:5] = torch.tensor([2.0, 1.5, 1.0, 0.0, -1.0], device="cuda")  # the mass sits on five tokens
    params = [SamplingParams(temperature=0.8) for _ in range(n)]
    batch = SamplingBatch.build(params, [[1]] * n, [[]] * n, [None] * n, torch.device("cuda"), vocab)
    ids = Sampler().sample(z.repeat(n, 1), batch).token_ids
    p = torch.softmax(z / 0.8, -1)[:5]
    freq = torch.bincount(ids, minlength=vocab)[:5].float() / n
    assert ids.max().item() < 5 and ((n * (freq - p) ** 2 / p).sum().item() < 18.5)  # chi2(4) 99.9%

    def seeded(rows: int) -> int:
        gens = [torch.Generator(device="cuda").manual_seed(7)] + [None] * (rows - 1)
        ps = [SamplingParams(temperature=1.0, seed=7)] + [SamplingParams(temperature=1.0)] * (rows - 1)
        b = SamplingBatch.build(ps, [[1]] * rows, [[]] * rows, gens, torch.device("cuda"), vocab)
        logits = torch.randn(rows, vocab, device="cuda", generator=g)
        logits[0] = z
        return int(Sampler().sample(logits, b).token_ids[0].item())

    assert seeded(1) == seeded(9) == seeded(33)


@pytest.mark.parametrize("t", [17, 256, 1000, 8192])
@pytest.mark.parametrize("e,block_m", [(32, 16), (128, 16), (128, 64)])
@pytest.mark.parametrize("mode", ["uniform", "skewed"])
def test_align_tokens_gpu(t: int, e: int, block_m: int, mode: str) -> None:
    """The routing plan at serving and prefill sizes against one built with a stable sort: each
    expert's slots in slot order, padded with the sentinel; every entry of every buffer."""
    g = torch.Generator(device="cuda").manual_seed(t + e)
    if mode == "uniform":
        ids = torch.rand(t, e, device="cuda", generator=g).topk(4, dim=-1).indices
    else:  # every token on experts 0-3: one segment of t rows each
        ids = torch.arange(4, device="cuda").repeat(t, 1)
    plan = align_tokens(ids, e, block_m)
    flat = ids.reshape(-1)
    counts = torch.bincount(flat, minlength=e)
    padded = (counts + block_m - 1) // block_m * block_m
    starts = torch.cumsum(padded, 0) - padded
    order = torch.sort(flat, stable=True).indices  # slots by expert, slot order within one
    rank = torch.arange(flat.numel(), device="cuda") - (torch.cumsum(counts, 0) - counts)[flat[order]]
    slots = torch.full((plan.sorted_slots.numel(),), flat.numel(), dtype=torch.int32, device="cuda")
    slots[starts[flat[order]] + rank] = order.int()
    used = int(padded.sum())
    tiles = torch.full((plan.max_blocks,), -1, dtype=torch.int32, device="cuda")
    tiles[:used // block_m] = torch.repeat_interleave(torch.arange(e, device="cuda"), padded // block_m).int()
    assert int(plan.num_padded.item()) == used
    assert torch.equal(plan.sorted_slots, slots) and torch.equal(plan.block_expert, tiles)


@pytest.mark.parametrize("t", [1, 2, 16, 17])
@pytest.mark.parametrize("e", [32, 128])
def test_route_with_plan_gpu(t: int, e: int) -> None:
    """Up to one token block (16) the router's kernel also builds the MoE's routing plan: the plan
    align_tokens builds from the same ids. Above, no plan (the MoE aligns)."""
    g = torch.Generator(device="cuda").manual_seed(t * e + 1)
    x = torch.randn(t, HIDDEN, device="cuda", generator=g).bfloat16()
    w = (torch.randn(e, HIDDEN, device="cuda", generator=g) / HIDDEN**0.5).bfloat16()
    b = torch.randn(e, device="cuda", generator=g).bfloat16()
    counters = router_counters("cuda")
    weights, ids, plan = route_with_plan(x, w, b, 4, counters, 16)
    ref_w, ref_ids = route(x, w, b, 4, counters)
    assert torch.equal(ids, ref_ids) and torch.equal(weights, ref_w) and not counters.any()
    if t > 16:
        assert plan is None
        return
    assert plan is not None
    expected = align_tokens(ids, e, 16)
    assert plan.max_blocks == expected.max_blocks and plan_tiles(plan) == plan_tiles(expected)


@pytest.mark.parametrize("t", [1, 3, 4, 5])
@pytest.mark.parametrize("e", [32, 128])
@pytest.mark.parametrize("splits", [0, 2])
def test_add_norm_route_with_plan_gpu(t: int, e: int, splits: int) -> None:
    """Up to 4 tokens the router's kernel also takes the post-attention add + RMSNorm, from the
    attention output as bf16 rows (splits 0) or float32 K-split partials: the new residual is bit
    for bit add_rms_norm's, the normed rows within a bf16 rounding of it, and the routing the
    unfused router's on those rows (the experts exactly, the weights within a bf16 rounding), with
    its plan. Above 4 tokens: the unfused pair itself."""
    g = torch.Generator(device="cuda").manual_seed(t * e + splits)
    a = torch.randn(splits, t, 1, HIDDEN, device="cuda", generator=g) if splits else (
        torch.randn(t, HIDDEN, device="cuda", generator=g).bfloat16())
    res = torch.randn(t, HIDDEN, device="cuda", generator=g).bfloat16()
    nw = (1 + torch.rand(HIDDEN, device="cuda", generator=g)).bfloat16()
    w = (torch.randn(e, HIDDEN, device="cuda", generator=g) / HIDDEN**0.5).bfloat16()
    b = torch.randn(e, device="cuda", generator=g).bfloat16()
    counters = router_counters("cuda")
    x, summed, weights, ids, plan = add_norm_route_with_plan(a, res, nw, 1e-5, w, b, 4, counters, 16)
    ref_x, ref_sum = add_rms_norm_triton(a, res, nw, 1e-5)
    assert torch.equal(summed, ref_sum) and not counters.any()
    ulp = 2.0**-7 * ref_x.float().abs()
    assert ((x.float() - ref_x.float()).abs() <= ulp).all()
    ref_w, ref_ids = route(x, w, b, 4, router_counters("cuda"))  # the unfused router on the same rows
    assert torch.equal(ids, ref_ids)
    rel_close(weights, ref_w, 2**-7)
    expected = align_tokens(ids, e, 16)
    assert plan is not None and plan.max_blocks == expected.max_blocks and plan_tiles(plan) == plan_tiles(expected)
    if t > 4:
        assert torch.equal(x, ref_x)


def test_logits_and_greedy_with_nan_on_the_real_vocab() -> None:
    """NaN logits on the GPU (linear/head_triton.py): as torch.argmax, the first NaN wins, even where a
    larger number comes first (token 0: NaN at rows 7,000 and 150,000, 10.0 at row 5), and an all-NaN
    row gives 0 (token 1), never an id past the vocabulary."""
    from osserve.ops.linear.head_triton import logits_and_greedy_triton
    from osserve.ops.linear.small_m_triton import DEFAULT_CONFIG

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(2, HIDDEN, device="cuda", generator=g).bfloat16()
    w = (torch.randn(201088, HIDDEN, device="cuda", generator=g) / HIDDEN**0.5).bfloat16()
    w[5] = (x[0].float() * (10.0 / x[0].float().pow(2).sum())).bfloat16()
    w[7000, 0] = w[150_000, 0] = float("nan")
    x[1, 0] = float("nan")
    for config in (None, DEFAULT_CONFIG):  # one token's config, and the other
        logits, greedy = logits_and_greedy_triton(x, w, config)
        assert greedy.tolist() == [7000, 0]
        assert torch.equal(greedy, logits.argmax(-1))


@pytest.mark.parametrize("t", [1, 3, 32])
def test_qkv_rope_cache_gpu(t: int) -> None:
    """Projection + RoPE + KV-cache write in one kernel against the two kernels it replaces
    (small-M linear, then rope_and_cache_triton gathering the table by position), bf16, 20b shapes."""
    from osserve.ops.linear.dispatch import linear
    from osserve.ops.rope.qkv_rope_triton import qkv_rope_cache_triton

    g = torch.Generator(device="cuda").manual_seed(t)
    rows = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    x = torch.randn(t, HIDDEN, device="cuda", generator=g).bfloat16()
    w = (torch.randn(rows, HIDDEN, device="cuda", generator=g) / HIDDEN**0.5).bfloat16()
    b = torch.randn(rows, device="cuda", generator=g).bfloat16()
    table = RopeTable.build(YarnRope(), HEAD_DIM, 131072, "cuda")
    positions = torch.randint(0, 131072, (t,), device="cuda", generator=g)
    num_blocks = 8
    slots = torch.randperm(num_blocks * BLOCK, device="cuda", generator=g)[:t]
    slots[1::3] = -1
    cache = torch.full((num_blocks, BLOCK, KV_HEADS, HEAD_DIM), POISON, device="cuda").bfloat16()
    kc_ref, vc_ref, kc, vc = cache.clone(), cache.clone(), cache.clone(), cache.clone()
    q, k, v = linear(x, w, b).split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
    q_ref, _ = rope_and_cache_triton(q.view(t, HEADS, HEAD_DIM), k.view(t, KV_HEADS, HEAD_DIM),
                                     v.view(t, KV_HEADS, HEAD_DIM), table.cos, table.sin, kc_ref, vc_ref, slots,
                                     positions=positions)
    q_new = qkv_rope_cache_triton(x, w, b, HEADS, KV_HEADS, table.cos, table.sin, positions, kc, vc, slots)
    rel_close(q_new, q_ref)
    rel_close(kc, kc_ref)
    rel_close(vc, vc_ref)
    assert torch.equal(kc == POISON, kc_ref == POISON) and torch.equal(vc == POISON, vc_ref == POISON)
    # Same rounding points as the unfused path: all but a few values (accumulation order) agree exactly.
    assert (q_new == q_ref).float().mean().item() > 0.9


def test_masks_uploaded_beside_a_running_forward() -> None:
    """Grammar masks copied on their own stream while the compute stream is busy (a chain of
    matmuls standing in for the step's forward, launched first): every step's sampling sees that
    step's masks, not the step before's, though the host buffer and the device buffer are reused
    each step (one allowed token a row, moving each step), and a grown buffer is filled correctly."""
    from osserve.engine.core.sampling_params import SamplingParams
    from osserve.engine.worker.sampler import MaskUpload, Sampler, SamplingBatch

    vocab, words = 201088, (201088 + 31) // 32
    upload, sampler = MaskUpload(torch.device("cuda")), Sampler()
    host = torch.zeros(64, words, dtype=torch.int32, pin_memory=True)
    busy = torch.randn(4096, 4096, device="cuda")
    for step, rows in enumerate([8, 8, 33, 64, 64, 5]):
        host.zero_()
        allowed = [(step * 1000 + 77 * r) % vocab for r in range(rows)]
        for r, tok in enumerate(allowed):
            host[r, tok // 32] = (1 << (tok % 32)) - (1 << 32 if tok % 32 == 31 else 0)
        x = busy
        for _ in range(20):  # ~ms of queued work ahead of the copy on the compute stream
            x = torch.tanh(x @ busy)
        logits = torch.randn(rows, vocab, device="cuda") + x[:rows, :1] * 0
        params = [SamplingParams(temperature=1.0)] * rows
        batch = SamplingBatch.build(params, [[1]] * rows, [[]] * rows, [None] * rows, torch.device("cuda"), vocab,
                                    token_masks=upload.upload(list(range(rows)), host[:rows]))
        ids = sampler.sample(logits, batch).token_ids
        upload.sampled()
        assert ids.tolist() == allowed, step  # .tolist() waits for the step: the host buffer is free again
