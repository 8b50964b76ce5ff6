"""The one-pass RMSNorm kernels against the reference (TRITON_INTERPRET=1 on CPU)."""

from __future__ import annotations

import pytest
import torch

from osserve.ops.norm.norm_triton import add_rms_norm_triton, embed_rms_norm_triton
from osserve.ops.norm.reference import (
    PendingTokens,
    add_rms_norm_reference,
    embed_rms_norm_reference,
    rms_norm_reference,
)


@pytest.mark.parametrize("t", [1, 3, 17])
@pytest.mark.parametrize("h", [64, 100])
def test_norms_match_reference(t: int, h: int) -> None:
    g = torch.Generator().manual_seed(t * h)
    x, res = torch.randn(t, h, generator=g) * 3, torch.randn(t, h, generator=g)
    w = torch.randn(h, generator=g)
    out, summed = add_rms_norm_triton(x, res, w, 1e-5)
    ref_out, ref_sum = add_rms_norm_reference(x, res, w, 1e-5)
    assert torch.allclose(summed, ref_sum) and (out - ref_out).abs().max() < 1e-5
    out, same = add_rms_norm_triton(x, None, w, 1e-5)
    assert same is x or torch.equal(same, x)
    assert (out - rms_norm_reference(x, w, 1e-5)).abs().max() < 1e-5


@pytest.mark.parametrize("h", [64, 100])
def test_embedding_gather_with_the_first_norm(h: int) -> None:
    """The rows are the table's, bit for bit; the normed rows the norm kernel's. With pending rows,
    a token whose row is >= 0 takes its id from the sampled ids (async scheduling), the others keep
    theirs; the reference does the same."""
    g = torch.Generator().manual_seed(h)
    table, w = torch.randn(50, h, generator=g), torch.randn(h, generator=g)
    ids = torch.tensor([3, 49, 0, 3, 17])
    out, rows = embed_rms_norm_triton(ids, table, w, 1e-5)
    assert torch.equal(rows, table[ids])
    assert torch.equal(out, add_rms_norm_triton(table[ids], None, w, 1e-5)[0])
    prev_rows, sampled = torch.tensor([-1, 2, 0, -1, 1]), torch.tensor([7, 8, 9, 40])
    out, rows = embed_rms_norm_triton(ids, table, w, 1e-5, prev_rows, sampled)
    taken = torch.tensor([3, 9, 7, 3, 8])
    assert torch.equal(rows, table[taken])
    ref_out, ref_rows = embed_rms_norm_reference(ids, table, w, 1e-5, PendingTokens(prev_rows, sampled))
    assert torch.equal(ref_rows, rows) and (out - ref_out).abs().max() < 1e-5
