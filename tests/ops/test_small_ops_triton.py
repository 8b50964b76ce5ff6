"""Norm, RoPE + KV-cache write and router top-k kernels vs their references (TRITON_INTERPRET=1,
CPU, small odd shapes). Outputs are pre-poisoned (NaN / sentinel) so unwritten elements show."""

from __future__ import annotations

import pytest
import torch

from osserve.config import YarnRope
from osserve.ops.norm.norm_triton import add_rms_norm_triton
from osserve.ops.norm.reference import add_rms_norm_reference, rms_norm_reference
from osserve.ops.rope.reference import (
    RopeTable,
    rope_and_cache_reference,
    rope_and_cache_table_reference,
    rope_cos_sin,
    yarn_inv_freq,
)
from osserve.ops.rope.rope_triton import rope_and_cache_triton
from osserve.ops.router.reference import route_reference
from osserve.ops.router.topk_triton import route_triton, topk_softmax_triton

DTYPES = [torch.float32, torch.bfloat16]
POISON = -12345.0


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    """fp32: max abs err < 1e-5; bf16: max err relative to max |b| < 1e-2."""
    assert a.shape == b.shape and a.dtype == b.dtype and not a.isnan().any()
    err = (a.float() - b.float()).abs().max().item()
    if a.dtype == torch.float32:
        assert err < 1e-5, err
    else:
        assert err <= 1e-2 * max(b.float().abs().max().item(), 1.0), err


def same_rounding(a: torch.Tensor, b: torch.Tensor) -> None:
    """Bit-equal where both round an fp32 value the same way: Triton's interpreter truncates
    fp32 -> bf16 instead of rounding to nearest, so on CPU bf16 is only checked as close."""
    if a.dtype == torch.float32 or a.is_cuda:
        assert torch.equal(a, b)
    else:
        close(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [1, 3, 17])
@pytest.mark.parametrize("h", [64, 100])
def test_norms(t: int, h: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(t * h)
    x = (torch.randn(t, h, generator=g) * 3).to(dtype)
    res = torch.randn(t, h, generator=g).to(dtype)
    w = torch.randn(h, generator=g).to(dtype)
    out, summed = add_rms_norm_triton(x, res, w, 1e-5)
    ref_out, ref_sum = add_rms_norm_reference(x, res, w, 1e-5)
    same_rounding(summed, ref_sum)  # the sum rounds as torch's x + residual does
    close(out, ref_out)
    close(add_rms_norm_triton(x, None, w, 1e-5)[0], rms_norm_reference(x, w, 1e-5))
    res_in_place = res.clone()
    out2, summed2 = add_rms_norm_triton(x, res_in_place, w, 1e-5, inplace=True)
    assert summed2 is res_in_place and torch.equal(summed2, summed) and torch.equal(out2, out)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("splits,k", [(1, 4), (2, 4), (3, 1)])
def test_add_rms_norm_of_unreduced_parts(splits: int, k: int, dtype: torch.dtype) -> None:
    """x as the MoE leaves it, [S, T, k, H] (float32 split partials, or rows in the model's dtype),
    and a strided view of it: summed over S and k before the add, as reduce_parts specifies."""
    t, h = 5, 100
    g = torch.Generator().manual_seed(splits * 10 + k)
    part_dtype = torch.float32 if splits > 1 else dtype
    parts = torch.randn(splits, t * k, h + 4, generator=g).to(part_dtype)[..., :h].view(splits, t, k, h)
    res = torch.randn(t, h, generator=g).to(dtype)
    w = torch.randn(h, generator=g).to(dtype)
    out, summed = add_rms_norm_triton(parts, res, w, 1e-5)
    ref_out, ref_sum = add_rms_norm_reference(parts, res, w, 1e-5)
    assert out.shape == summed.shape == (t, h) and out.dtype == summed.dtype == dtype
    close(summed, ref_sum)
    close(out, ref_out)
    if dtype == torch.float32:  # splits outer, experts inner: the order moe_swapped.sum_experts adds in
        in_order = sum(parts[s, :, j] for s in range(splits) for j in range(k))
        assert torch.equal(summed, in_order + res)


def rope_case(t: int, heads: int, kv_heads: int, d: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(t, heads, d, generator=g).to(dtype)
    k = torch.randn(t, kv_heads, d, generator=g).to(dtype)
    v = torch.randn(t, kv_heads, d, generator=g).to(dtype)
    num_blocks, block_size = 6, 4
    positions = torch.randint(0, 200, (t,), generator=g)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:t]
    slots[::3] = -1  # every third token is not stored (e.g. a padded or prefix-cached row)
    cache = torch.full((num_blocks, block_size, kv_heads, d), POISON, dtype=dtype)
    return q, k, v, positions, slots, cache


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [1, 3, 17])
@pytest.mark.parametrize("heads,kv_heads,d", [(4, 1, 16), (4, 1, 64), (6, 2, 64)])
def test_rope_and_cache(t: int, heads: int, kv_heads: int, d: int, dtype: torch.dtype) -> None:
    q, k, v, positions, slots, cache = rope_case(t, heads, kv_heads, d, dtype, t * d + heads)
    table = RopeTable.build(YarnRope(), d, 256)
    inv_freq, conc = yarn_inv_freq(YarnRope(), d)
    cos, sin = rope_cos_sin(positions, inv_freq, conc)
    assert torch.equal(cos, table.cos[positions]) and torch.equal(sin, table.sin[positions])

    kc_ref, vc_ref = cache.clone(), cache.clone()
    q_ref, k_ref = rope_and_cache_reference(q, k, v, cos, sin, kc_ref, vc_ref, slots)
    kc2, vc2 = cache.clone(), cache.clone()
    q_ref2, k_ref2 = rope_and_cache_table_reference(q, k, v, positions, table, kc2, vc2, slots)
    assert torch.equal(q_ref2, q_ref) and torch.equal(kc2, kc_ref) and torch.equal(vc2, vc_ref)

    for use_table in (False, True):
        kc, vc = cache.clone(), cache.clone()
        if use_table:
            qo, ko = rope_and_cache_triton(q, k, v, table.cos, table.sin, kc, vc, slots, positions=positions)
        else:
            qo, ko = rope_and_cache_triton(q, k, v, cos, sin, kc, vc, slots)
        close(qo, q_ref)
        close(ko, k_ref)
        assert torch.equal(vc, vc_ref)  # v is copied bit-exactly; untouched slots keep the poison
        stored = slots[slots >= 0]
        assert torch.equal(kc.view(-1, kv_heads, d)[stored], ko[slots >= 0])  # cache holds k_rot
        untouched = torch.ones(kc.shape[0] * kc.shape[1], dtype=torch.bool)
        untouched[stored] = False
        assert (kc.view(-1, kv_heads, d)[untouched] == POISON).all()


def test_rope_inplace_and_strided_qkv() -> None:
    """q/k/v as column splits of one fused qkv output [T, (H + 2·KVH)·D], rotated in place."""
    t, heads, kv_heads, d = 5, 4, 2, 16
    g = torch.Generator().manual_seed(7)
    qkv = torch.randn(t, (heads + 2 * kv_heads) * d, generator=g)
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=1)
    q, k, v = q.view(t, heads, d), k.view(t, kv_heads, d), v.view(t, kv_heads, d)
    positions, slots = torch.arange(t) + 3, torch.tensor([0, -1, 5, 9, 2])
    table = RopeTable.build(YarnRope(), d, 16)
    kc_ref, vc_ref = torch.zeros(3, 4, kv_heads, d), torch.zeros(3, 4, kv_heads, d)
    q_ref, k_ref = rope_and_cache_table_reference(q, k, v, positions, table, kc_ref, vc_ref, slots)
    kc, vc = torch.zeros_like(kc_ref), torch.zeros_like(vc_ref)
    qo, ko = rope_and_cache_triton(q, k, v, table.cos, table.sin, kc, vc, slots, positions=positions,
                                   inplace=True)
    assert qo.data_ptr() == q.data_ptr() and ko.data_ptr() == k.data_ptr()
    close(qo, q_ref)
    close(ko, k_ref)
    close(kc, kc_ref)
    assert torch.equal(vc, vc_ref)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [1, 3, 17])
@pytest.mark.parametrize("e", [8, 32, 20])
def test_router(t: int, e: int, dtype: torch.dtype) -> None:
    h = 64
    for seed in range(t * e, t * e + 100):  # bf16 logits tie now and then: draw until the top
        g = torch.Generator().manual_seed(seed)  # k+1 are tie-free, so only one answer is right
        x = torch.randn(t, h, generator=g).to(dtype)
        w = (torch.randn(e, h, generator=g) / h**0.5).to(dtype)
        b = torch.randn(e, generator=g).to(dtype)
        logits = torch.nn.functional.linear(x, w, b)
        top = logits.float().topk(5, dim=-1).values
        if (top[:, :-1] > top[:, 1:]).all():
            break
    else:
        pytest.fail("no tie-free draw")
    ref_w, ref_ids = route_reference(x, w, b, 4)
    weights, ids = route_triton(x, w, b, 4)
    assert ids.dtype == torch.int64 and torch.equal(ids, ref_ids)
    close(weights, ref_w)


def test_router_ties_and_infinities() -> None:
    """Ties: lower index first; -inf logits are each picked at most once."""
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0, -1.0, 2.0, 3.0],
                           [float("-inf")] * 6 + [5.0, float("-inf")]])
    weights, ids = topk_softmax_triton(logits, 4)
    assert ids.tolist() == [[1, 2, 4, 7], [6, 0, 1, 2]]
    assert torch.allclose(weights[0], torch.full((4,), 0.25))
    assert weights[1].tolist() == [1.0, 0.0, 0.0, 0.0]


def test_router_zero_ties_and_negative_order() -> None:
    """-0.0 and +0.0 are one value (lower index first), and negatives order by value, not by bits."""
    logits = torch.tensor([[-2.0, -0.0, -0.5, 0.0, -3.0, -0.25, -1.0, -4.0],
                           [-1e-30, -7.0, -1e30, -6.5, -7.5, -6.0, -8.0, -2e-30]])
    weights, ids = topk_softmax_triton(logits, 4)
    assert ids.tolist() == [[1, 3, 5, 2], [0, 7, 5, 3]]
    ref = torch.softmax(logits.gather(1, ids), dim=-1)
    assert torch.allclose(weights, ref)
