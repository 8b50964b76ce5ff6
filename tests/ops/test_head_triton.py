"""The logits projection with its greedy choice (ops/linear/head_triton.py) against F.linear and
torch.argmax (TRITON_INTERPRET=1, CPU, float32: the interpreter's bf16 tl.dot is wrong, so bf16 is
tested on the GPU, tests/gpu/test_small_ops_gpu.py): ties won by the first row within a block and
across blocks, ragged N and K, 1 to 32 tokens."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from osserve.ops.linear.head_triton import fits_logits_triton, logits_and_greedy_triton
from osserve.ops.linear.small_m_triton import MAX_TOKENS, LinearConfig

SMALL = LinearConfig(16, 32, 4, 2)


@pytest.mark.parametrize("m", [1, 3, MAX_TOKENS])
@pytest.mark.parametrize(("n", "k"), [(40, 128), (33, 100), (130, 96)])
def test_logits_and_greedy_match_linear_and_argmax(m: int, n: int, k: int) -> None:
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    assert fits_logits_triton(x, w)
    logits, greedy = logits_and_greedy_triton(x, w, SMALL)
    assert logits.shape == (m, n) and logits.dtype == torch.float32
    assert greedy.shape == (m,) and greedy.dtype == torch.int64
    assert (logits - F.linear(x, w)).abs().max().item() < 1e-4
    assert torch.equal(greedy, logits.argmax(-1))


def test_ties_go_to_the_first_row() -> None:
    """Equal best logits within one block (rows 3 and 7) and across blocks (rows 20 and 37, blocks
    of 16): the first row wins, as torch.argmax. A second token's best is in the ragged last block."""
    k, n = 32, 45
    w = torch.zeros(n, k)
    w[[3, 7], 0] = 2.0  # token 0: x = e0
    w[[20, 37], 1] = 3.0  # token 1: x = e1
    w[44, 2] = 5.0  # token 2: x = e2, the last (ragged) block
    x = torch.eye(3, k)
    logits, greedy = logits_and_greedy_triton(x, w, SMALL)
    assert greedy.tolist() == [3, 20, 44]
    assert torch.equal(greedy, logits.argmax(-1))
    x = torch.zeros(1, k)  # every logit 0: row 0
    assert logits_and_greedy_triton(x, w, SMALL)[1].tolist() == [0]
    x = torch.eye(3, k)[1:2]  # one token, the default config (head_config: its own for one token)
    assert logits_and_greedy_triton(x, w)[1].tolist() == [20]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy on NaN rows
def test_nan_logits_choose_the_first_nan_as_torch_argmax() -> None:
    """A NaN counts as the largest logit (torch.argmax). Rows 20 and 37 hold an inf, which gives a
    NaN against a 0 and -inf against -1. Token 0: its first NaN, row 20, in a later block than its
    largest number (row 3); token 1: all NaN (row 0); token 2: no NaN, -inf at rows 20 and 37 (row
    44). Blocks of 16 rows."""
    k, n = 32, 45
    w = torch.zeros(n, k)
    w[3, 0], w[20, 5], w[37, 5], w[44, 2] = 9.0, float("inf"), float("inf"), 5.0
    x = torch.eye(3, k)
    x[1] = float("nan")
    x[2, 5] = -1.0
    logits, greedy = logits_and_greedy_triton(x, w, SMALL)
    assert logits[0, 20].isnan() and logits[2, 20] == float("-inf")
    assert greedy.tolist() == [20, 0, 44]
    assert torch.equal(greedy, logits.argmax(-1))


def test_ids_into_given_buffers_and_a_row_of_the_host_ring() -> None:
    """greedy_out receives the ids; host_out's ring gets them in the row its slot names, and its
    other row is left as it was."""
    from osserve.ops.linear.head_triton import HostIds

    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(3, 64, generator=g), torch.randn(50, 64, generator=g)
    out = torch.full((3,), -5, dtype=torch.int64)
    ring = torch.full((2, 4), -9, dtype=torch.int64)
    logits, greedy = logits_and_greedy_triton(x, w, SMALL, greedy_out=out,
                                              host_out=HostIds(ring, torch.tensor([1], dtype=torch.int32)))
    assert greedy is out and torch.equal(out, logits.argmax(-1))
    assert ring[1, :3].tolist() == out.tolist() and ring[1, 3].item() == -9 and ring[0].tolist() == [-9] * 4
