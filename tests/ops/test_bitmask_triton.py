"""A grammar's token mask applied to logits (TRITON_INTERPRET=1, CPU): the Triton kernel writes
-inf exactly where the reference does, only in the masked rows, at odd vocabulary sizes."""

from __future__ import annotations

import pytest
import torch

from osserve.ops.sampling.bitmask_triton import apply_token_bitmask_triton
from osserve.ops.sampling.reference import apply_token_bitmask_reference


def allowed_by_bits(bits: torch.Tensor, vocab: int) -> torch.Tensor:
    """The spec of the layout, token by token: bit t % 32 of word t // 32."""
    return torch.tensor([[(int(row[t // 32]) >> (t % 32)) & 1 == 1 for t in range(vocab)] for row in bits])


@pytest.mark.parametrize("vocab,dtype", [(37, torch.float32), (4096, torch.float32), (5000, torch.float32),
                                         (5000, torch.bfloat16), (37, torch.float16)])
def test_kernel_matches_reference_and_the_bit_layout(vocab: int, dtype: torch.dtype) -> None:
    """float32 logits, and the model's dtype in which the head leaves them at serving batches."""
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(5, vocab, generator=g).to(dtype)
    words = (vocab + 31) // 32
    bits = torch.randint(-2**31, 2**31 - 1, (3, words), generator=g, dtype=torch.int64).to(torch.int32)
    bits[1] = 0  # a row that allows nothing
    bits[2, 0] = -1  # all 32 of its first tokens allowed (the sign bit included)
    rows = torch.tensor([4, 0, 2])
    ref = apply_token_bitmask_reference(logits.clone(), rows, bits)
    out = apply_token_bitmask_triton(logits.clone(), rows, bits)
    assert torch.equal(out, ref)
    expected = logits.clone()
    allowed = allowed_by_bits(bits, vocab)
    for k, row in enumerate(rows.tolist()):
        expected[row][~allowed[k]] = float("-inf")
    assert torch.equal(ref, expected)
    assert torch.equal(out[[1, 3]], logits[[1, 3]])  # rows without a mask are untouched
