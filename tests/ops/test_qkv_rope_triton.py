"""The decode attention's input kernel (q/k/v projection + RoPE + KV-cache write, rope/qkv_rope_triton.py)
against the unfused path it replaces (projection, split, rope_and_cache_table_reference), under
TRITON_INTERPRET=1 on CPU: odd hidden sizes (a ragged K step), padded rows (slot -1), GQA. float32
only: the interpreter's tl.dot on bf16 operands returns garbage (linear_triton's kernel too); the
GPU test (tests/gpu/test_small_ops_gpu.py) covers bf16."""

from __future__ import annotations

import pytest
import torch

from osserve.config import YarnRope
from osserve.ops.attention.kv_format import KVCache
from osserve.ops.rope.dispatch import qkv_rope_and_cache
from osserve.ops.rope.qkv_rope_triton import fits_qkv_rope, qkv_rope_cache_triton
from osserve.ops.rope.reference import RopeTable, rope_and_cache_table_reference
from tests.ops.test_small_ops_triton import POISON, close


def case(t: int, hidden: int, heads: int, kv_heads: int, d: int, dtype: torch.dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    rows = (heads + 2 * kv_heads) * d
    x = torch.randn(t, hidden, generator=g).to(dtype)
    w = (torch.randn(rows, hidden, generator=g) / hidden**0.5).to(dtype)
    b = torch.randn(rows, generator=g).to(dtype)
    table = RopeTable.build(YarnRope(), d, 300)
    positions = torch.randint(0, 300, (t,), generator=g)
    num_blocks, block_size = 8, 4
    slots = torch.randperm(num_blocks * block_size, generator=g)[:t]
    slots[1::3] = -1  # padded or prefix-cached rows: not stored
    cache = torch.full((num_blocks, block_size, kv_heads, d), POISON, dtype=dtype)
    return x, w, b, table, positions, slots, cache


def unfused(x, w, b, heads, kv_heads, d, table, positions, slots, k_cache, v_cache):  # noqa: ANN001, ANN201
    t = x.shape[0]
    qkv = torch.nn.functional.linear(x.float(), w.float(), b.float()).to(x.dtype)
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    q, _ = rope_and_cache_table_reference(q.reshape(t, heads, d), k.reshape(t, kv_heads, d), v.reshape(t, kv_heads, d),
                                          positions, table, k_cache, v_cache, slots)
    return q


@pytest.mark.parametrize("t", [1, 3, 17])
@pytest.mark.parametrize("hidden,heads,kv_heads,d", [(128, 4, 2, 32), (100, 6, 2, 64), (300, 2, 1, 32)])
def test_matches_the_unfused_path(t: int, hidden: int, heads: int, kv_heads: int, d: int) -> None:
    x, w, b, table, positions, slots, cache = case(t, hidden, heads, kv_heads, d, torch.float32, seed=t + hidden)
    kc_ref, vc_ref, kc, vc = cache.clone(), cache.clone(), cache.clone(), cache.clone()
    q_ref = unfused(x, w, b, heads, kv_heads, d, table, positions, slots, kc_ref, vc_ref)
    assert fits_qkv_rope(x, w, d)
    q = qkv_rope_cache_triton(x, w, b, heads, kv_heads, table.cos, table.sin, positions, kc, vc, slots)
    close(q, q_ref)
    close(kc, kc_ref)  # includes the untouched (POISON) slots
    close(vc, vc_ref)
    assert torch.equal(kc == POISON, kc_ref == POISON) and torch.equal(vc == POISON, vc_ref == POISON)


def test_dispatch_takes_the_unfused_path_on_cpu_and_where_it_does_not_fit() -> None:
    x, w, b, table, positions, slots, cache = case(3, 64, 2, 1, 16, torch.float32, seed=1)
    kc_ref, vc_ref, kc, vc = cache.clone(), cache.clone(), cache.clone(), cache.clone()
    assert not fits_qkv_rope(x, w, 16)  # 8-row halves: below the MMA's 16
    assert not fits_qkv_rope(torch.zeros(33, 64), w, 32)  # above linear_triton.MAX_TOKENS
    q = qkv_rope_and_cache(x, w, b, 2, 1, positions, table, KVCache(kc, vc), slots)
    q_ref = unfused(x, w, b, 2, 1, 16, table, positions, slots, kc_ref, vc_ref)
    close(q, q_ref)
    assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref)
