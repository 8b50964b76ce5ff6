"""The batched sampler's pieces against hand computations (no model)."""

from __future__ import annotations

import math

import torch

from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.worker.sampler import Sampler, SamplingBatch, apply_min_p, apply_penalties, apply_top_k_top_p

V = 8


def batch(params: list[SamplingParams], outputs: list[list[int]] | None = None, prompts=None, gens=None):  # type: ignore[no-untyped-def]
    outputs = outputs or [[] for _ in params]
    prompts = prompts or [[0] for _ in params]
    return SamplingBatch.build(params, prompts, outputs, gens or [None] * len(params), torch.device("cpu"), V)


def test_greedy_is_argmax_and_top_k_1_is_greedy() -> None:
    logits = torch.randn(5, V)
    out = Sampler().sample(logits, batch([SamplingParams(temperature=0)] * 5))
    assert torch.equal(out.token_ids, logits.argmax(-1))
    out = Sampler().sample(logits, batch([SamplingParams(temperature=1.0, top_k=1)] * 5))
    assert torch.equal(out.token_ids, logits.argmax(-1))


def test_top_p_keeps_the_smallest_nucleus() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.1, 0.05, 0.05, 0, 0, 0]]) + 1e-9
    masked = apply_top_k_top_p(probs.log(), None, torch.tensor([0.75]))
    assert torch.isfinite(masked[0, :2]).all() and torch.isinf(masked[0, 2:]).all()
    masked = apply_top_k_top_p(probs.log(), torch.tensor([3]), torch.tensor([1.0]))
    assert torch.isfinite(masked[0, :3]).all() and torch.isinf(masked[0, 3:]).all()


def test_min_p() -> None:
    logits = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.04), math.log(0.16)] + [-1e9] * 4])
    kept = torch.isfinite(apply_min_p(logits, torch.tensor([0.1])))[0, :4].tolist()
    assert kept == [True, True, False, True]  # threshold 0.05


def test_penalties_by_hand() -> None:
    p = SamplingParams(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    b = batch([p], outputs=[[1, 1, 2]], prompts=[[3]])
    logits = torch.tensor([[1.0, 2.0, -1.0, 4.0, 1.0, 0, 0, 0]])
    got = apply_penalties(logits, b)[0].tolist()
    # token 1: seen → 2/2 = 1, count 2 → 1 - 0.5*2 - 0.25 = -0.25; token 2: seen, negative → -2,
    # count 1 → -2 - 0.5 - 0.25 = -2.75; token 3: prompt only → 4/2 = 2, no count; others unchanged.
    assert got[:5] == [1.0, -0.25, -2.75, 2.0, 1.0]


def test_temperature_sampling_follows_the_distribution() -> None:
    torch.manual_seed(0)
    probs = torch.tensor([0.6, 0.3, 0.1] + [0.0] * 5)
    logits = (probs + 1e-12).log().repeat(4000, 1)
    out = Sampler().sample(logits, batch([SamplingParams(temperature=1.0)] * 4000)).token_ids
    freq = torch.bincount(out, minlength=V).float() / 4000
    assert (freq[:3] - probs[:3]).abs().max() < 0.03 and freq[3:].sum() == 0


def test_seeded_rows_do_not_depend_on_the_batch() -> None:
    logits = torch.randn(3, V)
    seeded = SamplingParams(temperature=1.0, seed=7)
    alone = Sampler().sample(logits[1:2], batch([seeded], gens=[torch.Generator().manual_seed(7)]))
    mixed = Sampler().sample(logits, batch([SamplingParams(temperature=1.0), seeded, SamplingParams(temperature=0)],
                                           gens=[None, torch.Generator().manual_seed(7), None]))
    assert alone.token_ids[0] == mixed.token_ids[1]


def test_min_tokens_masks_stop_ids_and_forced_tokens() -> None:
    logits = torch.zeros(1, V)
    logits[0, 5] = 10.0
    p = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[5])
    assert Sampler().sample(logits, batch([p], outputs=[[1]])).token_ids[0] != 5
    assert Sampler().sample(logits, batch([p], outputs=[[1, 2]])).token_ids[0] == 5
    f = SamplingParams(temperature=0, forced_token_ids=[3, 4])
    assert Sampler().sample(logits, batch([f], outputs=[[3]])).token_ids[0] == 4
    assert Sampler().sample(logits, batch([f], outputs=[[3, 4]])).token_ids[0] == 5


def test_logprobs_are_the_raw_distribution() -> None:
    logits = torch.randn(2, V)
    out = Sampler().sample(logits, batch([SamplingParams(temperature=0, logprobs=3)] * 2))
    ref = logits.log_softmax(-1)
    assert torch.allclose(out.logprobs, ref.gather(1, out.token_ids[:, None])[:, 0])
    assert out.top_logprobs is not None and torch.allclose(out.top_logprobs, ref.topk(3, -1).values)


def test_each_row_samples_as_alone_whatever_tensors_its_batch_builds() -> None:
    """A batch builds only the settings some row uses (greedy alone: none): every row's token is
    the one it gets alone, in a batch that builds every tensor (temperature, top-k/p, min-p,
    penalties, stop masks, forced tokens)."""
    logits = torch.randn(7, V)
    rows = [
        (SamplingParams(temperature=0), [1]),
        (SamplingParams(temperature=0, min_tokens=3, stop_token_ids=[int(logits[1].argmax())]), [1]),
        (SamplingParams(temperature=0, forced_token_ids=[2, 6]), [2]),
        (SamplingParams(temperature=0.7, top_k=3, seed=1), [1]),
        (SamplingParams(temperature=1.0, top_p=0.8, seed=2), [1]),
        (SamplingParams(temperature=1.0, min_p=0.2, seed=3), [4, 4]),
        (SamplingParams(temperature=1.0, repetition_penalty=1.5, frequency_penalty=0.5, seed=4), [3, 3]),
    ]

    def gens() -> list[torch.Generator | None]:
        return [torch.Generator().manual_seed(p.seed) if p.seed is not None else None for p, _ in rows]

    together = Sampler().sample(logits, batch([p for p, _ in rows], outputs=[o for _, o in rows], gens=gens()))
    alone = [Sampler().sample(logits[i:i + 1], batch([p], outputs=[o], gens=[g])).token_ids[0]
             for i, ((p, o), g) in enumerate(zip(rows, gens(), strict=True))]
    assert together.token_ids.tolist() == [int(t) for t in alone]
    assert together.token_ids[2] == 6 and together.token_ids[1] != logits[1].argmax()
    plain = batch([SamplingParams(temperature=0)] * 3)
    assert plain.settings.temperature is None and plain.settings.top_k is None
    assert plain.penalties is None and not plain.forced


def test_greedy_ids_from_the_runner_are_taken_only_where_the_logits_are_unchanged() -> None:
    """The runner's argmax (ops/linear/head_triton.py) stands in for the sampler's own where every row is
    greedy and no mask or penalty touched the logits; otherwise the sampler computes it. (The ids
    given here are deliberately not the argmax, to tell the two apart.)"""
    logits = torch.zeros(2, V)
    logits[:, 5] = 10.0
    given = torch.tensor([1, 2])
    greedy = SamplingParams(temperature=0)
    assert Sampler().sample(logits, batch([greedy] * 2), given).token_ids.tolist() == [1, 2]
    masked = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[5])
    out = Sampler().sample(logits, batch([greedy, masked], outputs=[[1], [1]]), given).token_ids.tolist()
    assert out[0] == 5 and out[1] != 5
    penalised = SamplingParams(temperature=0, presence_penalty=20.0)
    assert Sampler().sample(logits, batch([penalised] * 2, outputs=[[5], [5]]), given).token_ids.tolist() != [1, 2]
    hot = SamplingParams(temperature=1.0, top_k=1)
    assert Sampler().sample(logits, batch([hot] * 2), given).token_ids.tolist() == [5, 5]


def test_row_settings_are_reused_only_for_the_same_rows_in_order() -> None:
    """A step's per-row settings are kept while the same requests sample in the same order; another
    order, another request or another count rebuilds them, and the scripted rows (stops banned up
    to min_tokens, forced tokens) follow each step's outputs either way."""
    greedy, hot = SamplingParams(temperature=0), SamplingParams(temperature=1.5, top_k=3)
    banned = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[4])
    forced = SamplingParams(temperature=0, forced_token_ids=[6, 7])
    rows = [greedy, hot, banned, forced]
    first = SamplingBatch.build(rows, [[0]] * 4, [[], [], [], []], [None] * 4, torch.device("cpu"), V)
    again = SamplingBatch.build(rows, [[0]] * 4, [[], [], [1, 1], [6]], [None] * 4, torch.device("cpu"), V,
                                settings=first.settings)
    assert again.settings is first.settings
    assert first.mask_stop == {2: [4]} and first.forced == {3: 6}
    assert again.mask_stop == {} and again.forced == {3: 7}
    swapped = SamplingBatch.build([hot, greedy, banned, forced], [[0]] * 4, [[]] * 4, [None] * 4,
                                  torch.device("cpu"), V, settings=first.settings)
    assert swapped.settings is not first.settings
    assert swapped.settings.temperature is not None and swapped.settings.temperature.tolist() == [1.5, 0.0, 0.0, 0.0]
    assert swapped.settings.top_k is not None and swapped.settings.top_k.tolist() == [3, V, V, V]
    copy = SamplingParams(**vars(greedy))  # equal, but another request's
    other = SamplingBatch.build([copy, hot, banned, forced], [[0]] * 4, [[]] * 4, [None] * 4, torch.device("cpu"),
                                V, settings=first.settings)
    assert other.settings is not first.settings
    fewer = SamplingBatch.build(rows[:3], [[0]] * 3, [[]] * 3, [None] * 3, torch.device("cpu"), V,
                                settings=first.settings)
    assert fewer.settings is not first.settings and fewer.forced == {}
    logits = torch.zeros(4, V)
    logits[:, 4] = 5.0  # the stop id is every row's argmax
    assert Sampler().sample(logits, first).token_ids.tolist()[2:] == [0, 6]  # banned (argmax of the rest), forced


def test_logits_in_the_models_dtype_sample_as_their_float32_values() -> None:
    """The head's GEMM output (bf16 at serving batches) reaches the sampler unwidened: a greedy batch
    (argmax, a grammar mask and logprobs on the narrow logits) and a mixed one (penalties, top-p,
    seeded temperature draws: widened first) choose what the same values in float32 choose, and the
    logprobs come out in float32."""
    g = torch.Generator().manual_seed(7)
    logits = (torch.randn(6, V, generator=g) * 3).to(torch.bfloat16)
    greedy = [SamplingParams(temperature=0), SamplingParams(temperature=0, logprobs=2)] * 3
    mixed = [SamplingParams(temperature=0), SamplingParams(temperature=0, logprobs=2),
             SamplingParams(temperature=0.8, seed=3), SamplingParams(temperature=1.0, top_p=0.6, seed=4),
             SamplingParams(temperature=0, presence_penalty=1.5), SamplingParams(temperature=1.2, seed=5)]
    outputs = [[1], [2], [3], [4], [int(logits[4].float().argmax())], [6]]
    mask = (torch.tensor([5]), torch.tensor([[0b00110101]], dtype=torch.int32))  # row 5: tokens 0, 2, 4, 5

    def run(x: torch.Tensor, params: list[SamplingParams]):  # type: ignore[no-untyped-def]
        gens = [torch.Generator().manual_seed(p.seed) if p.seed is not None else None for p in params]
        b = SamplingBatch.build(params, [[0]] * 6, outputs, gens, torch.device("cpu"), V, token_masks=mask)
        return Sampler().sample(x.clone(), b)

    for params in (greedy, mixed):
        narrow, wide = run(logits, params), run(logits.float(), params)
        assert torch.equal(narrow.token_ids, wide.token_ids)
        assert narrow.token_ids[5].item() in (0, 2, 4, 5)
        assert narrow.logprobs is not None and narrow.logprobs.dtype == torch.float32
        assert torch.equal(narrow.logprobs, wide.logprobs)
