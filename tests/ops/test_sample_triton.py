"""The fused Gumbel-max sampler (TRITON_INTERPRET=1, CPU): draws follow softmax(z / T), rows at
temperature 0 take the argmax (lowest id on ties), and a row's draw depends only on its seed."""

from __future__ import annotations

import torch

from osserve.ops.sampling.gumbel_triton import gumbel_argmax_triton


def test_draws_follow_the_tempered_softmax() -> None:
    g = torch.Generator().manual_seed(0)
    z = torch.randn(1, 6, generator=g) * 2
    n, temp = 800, 0.7
    ids = gumbel_argmax_triton(z.repeat(n, 1), torch.full((n,), temp), torch.randint(0, 2**62, (n,), generator=g))
    p = torch.softmax(z[0] / temp, -1)
    freq = torch.bincount(ids, minlength=6).float() / n
    # Pearson's chi-square with 5 degrees of freedom: 20.5 is its 99.9th percentile.
    chi2 = (n * (freq - p) ** 2 / p).sum().item()
    assert chi2 < 20.5, (freq, p)


def test_temperature_zero_is_argmax_and_ties_go_low() -> None:
    z = torch.tensor([[0.0, 3.0, 1.0, 3.0], [5.0, -1.0, 5.0, 2.0], [-float("inf"), -2.0, -1.0, -3.0]])
    ids = gumbel_argmax_triton(z, torch.zeros(3), torch.tensor([1, 2, 3]))
    assert ids.tolist() == [1, 0, 2]


def test_a_rows_draw_depends_on_its_seed_only() -> None:
    g = torch.Generator().manual_seed(1)
    z = torch.randn(5, 3000, generator=g)
    seeds = torch.randint(0, 2**62, (5,), generator=g)
    temp = torch.tensor([1.0, 0.5, 0.0, 2.0, 1.0])
    batch = gumbel_argmax_triton(z, temp, seeds)
    alone = [gumbel_argmax_triton(z[i: i + 1], temp[i: i + 1], seeds[i: i + 1]).item() for i in range(5)]
    assert batch.tolist() == alone
    other = gumbel_argmax_triton(z, temp, seeds + 1)
    assert other[2] == batch[2] and not torch.equal(other, batch)  # greedy row unmoved; the rest redrawn


def test_splitting_the_vocabulary_changes_no_draw() -> None:
    """Programs over parts of a row (splits) draw the same noise per token id: same winners."""
    g = torch.Generator().manual_seed(2)
    z = torch.randn(3, 5000, generator=g)
    z[2, 100] = z[2, 4000] = 50.0  # a tie across splits, greedy: the lower id wins
    temp, seeds = torch.tensor([1.0, 0.3, 0.0]), torch.randint(0, 2**62, (3,), generator=g)
    one = gumbel_argmax_triton(z, temp, seeds, num_splits=1)
    assert torch.equal(gumbel_argmax_triton(z, temp, seeds, num_splits=3), one) and one[2] == 100


def test_tokens_that_share_a_philox_call_or_its_counter_draw_apart() -> None:
    """One Philox call gives the noise of four tokens a quarter step apart, and the next step's
    counters follow on: equal logits at ids that share a call (3 + k * BLOCK / 4) or the counter of
    the step after (3 + BLOCK) must each win a fifth of the draws, not the lowest id always."""
    from osserve.ops.sampling.gumbel_triton import BLOCK

    ids = [3, 3 + BLOCK // 4, 3 + BLOCK // 2, 3 + 3 * BLOCK // 4, 3 + BLOCK]
    n = 500
    z = torch.full((n, 2 * BLOCK), -float("inf"))
    z[:, ids] = 1.0
    g = torch.Generator().manual_seed(3)
    chosen = gumbel_argmax_triton(z, torch.ones(n), torch.randint(0, 2**62, (n,), generator=g))
    counts = torch.tensor([(chosen == i).sum().item() for i in ids], dtype=torch.float32)
    assert counts.sum() == n
    # Pearson's chi-square against 1/5 each, 4 degrees of freedom: 18.5 is its 99.9th percentile.
    chi2 = ((counts - n / 5) ** 2 / (n / 5)).sum().item()
    assert chi2 < 18.5, counts


def test_bf16_logits_draw_as_their_float32_values() -> None:
    """The head's bf16 logits are read as they are: the same draws as the float32 tensor of the same
    values, at any temperature."""
    g = torch.Generator().manual_seed(4)
    z = (torch.randn(4, 5000, generator=g) * 3).to(torch.bfloat16)
    temp, seeds = torch.tensor([1.0, 0.0, 0.6, 1.3]), torch.randint(0, 2**62, (4,), generator=g)
    assert torch.equal(gumbel_argmax_triton(z, temp, seeds), gumbel_argmax_triton(z.float(), temp, seeds))
