"""Triton paged attention vs the reference. On CPU these run under TRITON_INTERPRET=1 at tiny
shapes (window 8/16, block size 4/16); tests/gpu repeats them at gpt-oss shapes."""

from __future__ import annotations

import os
import zlib

import pytest
import torch

from tests.ops.attention_cases import make_case, prompt_range, reference, rel_err

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA or TRITON_INTERPRET=1",
)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def run_kernel(case, is_decode: bool, **overrides) -> torch.Tensor:
    from osserve.ops.attention.paged_triton import paged_attention_triton

    qsl, seq_lens = case.device_meta()
    out = torch.full_like(case.q, float("nan"))  # poison: every row must be written
    q_lens = [b - a for a, b in zip(case.query_start_loc, case.query_start_loc[1:], strict=False)]
    paged_attention_triton(
        case.q, case.k_cache, case.v_cache, case.sinks, qsl, seq_lens, case.block_tables,
        case.scale, case.window, max(q_lens), max(case.seq_lens), is_decode, out=out, **overrides,
    )
    return out


def check(case, is_decode: bool, tol: float = 1e-4, **overrides) -> None:
    out = run_kernel(case, is_decode, **overrides)
    assert not out.isnan().any(), "unwritten or NaN rows"
    err = rel_err(out, reference(case))
    assert err < tol, err


# (seq_len, query_len) batches: prefill, chunked prefill (chunk boundary inside the window),
# contexts below / at / above the window, mixed decode + prefill, very different lengths.
PREFILL_BATCHES = {
    "single_odd": [(37, 37)],
    "chunk_in_window": [(50, 13)],
    "ctx_lt_eq_gt_window": [(9, 9), (16, 16), (40, 40)],
    "chunks_around_window": [(16, 5), (17, 3), (47, 31)],
    "mixed": [(5, 5), (64, 1), (33, 20), (70, 3), (16, 16), (1, 1)],
}


@pytest.mark.parametrize("batch", list(PREFILL_BATCHES))
@pytest.mark.parametrize("window", [None, 8, 16])
@pytest.mark.parametrize("block_size", [4, 16])
def test_prefill_matches_reference(batch: str, window: int | None, block_size: int) -> None:
    seed = zlib.crc32(f"{batch}{window}{block_size}".encode()) % 10_000
    outside = "poison" if seed % 2 else "hole"
    case = make_case(PREFILL_BATCHES[batch], 4, 2, 16, block_size, window, device=DEVICE,
                     outside=outside, seed=seed)
    check(case, is_decode=False)


@pytest.mark.parametrize("heads", [(4, 1), (3, 1), (2, 2)])
def test_prefill_group_shapes(heads: tuple[int, int]) -> None:
    """GQA group 4, a non-power-of-two group (padded rows) and no grouping; head_dim 32."""
    case = make_case([(29, 29), (40, 11)], heads[0], heads[1], 32, 4, 16, device=DEVICE, seed=7,
                     outside="poison")
    check(case, is_decode=False)


DECODE_LENS = [1, 7, 16, 17, 95, 130]


@pytest.mark.parametrize("num_splits", [1, 2, 4])
@pytest.mark.parametrize("window", [None, 16])
@pytest.mark.parametrize("outside", ["hole", "poison"])
def test_decode_matches_reference(num_splits: int, window: int | None, outside: str) -> None:
    seed = num_splits * 100 + (window or 0) + (outside == "poison")
    case = make_case([(n, 1) for n in DECODE_LENS], 4, 2, 16, 4, window, device=DEVICE,
                     outside=outside, seed=seed)
    check(case, is_decode=True, num_splits=num_splits)


def test_decode_splits_more_than_tiles() -> None:
    """More splits than a short context has tiles: empty splits must merge to nothing."""
    case = make_case([(3, 1), (20, 1)], 4, 2, 16, 16, None, device=DEVICE, seed=3)
    check(case, is_decode=True, num_splits=8)


def test_decode_path_equals_prefill_path() -> None:
    case = make_case([(n, 1) for n in (5, 33, 64)], 4, 2, 16, 4, 8, device=DEVICE, seed=11)
    a = run_kernel(case, is_decode=True, num_splits=2)
    b = run_kernel(case, is_decode=False)
    assert rel_err(a, b.float()) < 1e-5


def test_write_kv_matches_reference() -> None:
    from osserve.ops.attention.paged_triton import write_kv_triton
    from osserve.ops.attention.reference import write_kv_reference

    gen = torch.Generator().manual_seed(5)
    k = torch.randn(9, 2, 16, generator=gen).to(DEVICE)
    v = torch.randn(9, 2, 16, generator=gen).to(DEVICE)
    slots = torch.randperm(24, generator=gen)[:9].to(DEVICE)
    slots[3] = -1
    caches = [torch.randn(6, 4, 2, 16, generator=gen).to(DEVICE) for _ in range(2)]
    expect = [c.clone() for c in caches]
    write_kv_triton(k, v, caches[0], caches[1], slots)
    write_kv_reference(k, v, expect[0], expect[1], slots)
    assert torch.equal(caches[0], expect[0]) and torch.equal(caches[1], expect[1])


@pytest.mark.parametrize("window", [33, 40])
def test_prefill_window_wider_than_tiles(window: int) -> None:
    """Window wide enough that whole unmasked KV tiles sit between the masked boundary tiles."""
    case = make_case([(100, 100), (90, 21), (120, 2)], 4, 2, 16, 4, window, device=DEVICE,
                     outside="poison", seed=window)
    check(case, is_decode=False)


# Mixed batches split in two launches (paged_attention_triton's prompt_range): one-token queries
# before, between and after the prompt chunks, so that the prefill kernel's range holds some of them
# (they must skip themselves) and the decode kernel meets the chunks (it must skip them).
MIXED_SPLIT_BATCHES = {
    "decodes_first": [(64, 1), (23, 1), (33, 20), (16, 16)],
    "interleaved": [(40, 1), (33, 20), (95, 1), (17, 3), (1, 1)],
    "decodes_last": [(12, 12), (50, 13), (7, 1), (130, 1)],
}


@pytest.mark.parametrize("batch", list(MIXED_SPLIT_BATCHES))
@pytest.mark.parametrize("window", [None, 16])
@pytest.mark.parametrize("num_splits", [1, 2])
def test_mixed_batch_split_matches_reference(batch: str, window: int | None, num_splits: int) -> None:
    seqs = MIXED_SPLIT_BATCHES[batch]
    case = make_case(seqs, 4, 2, 16, 4, window, device=DEVICE, outside="poison", seed=len(batch) + num_splits)
    check(case, is_decode=False, prompt_range=prompt_range(seqs), num_splits=num_splits)


def test_mixed_batch_split_equals_one_launch() -> None:
    seqs = MIXED_SPLIT_BATCHES["interleaved"]
    case = make_case(seqs, 4, 2, 16, 4, 8, device=DEVICE, seed=5)
    split = run_kernel(case, is_decode=False, prompt_range=prompt_range(seqs), num_splits=2)
    whole = run_kernel(case, is_decode=False)
    assert rel_err(split, whole.float()) < 1e-5


def test_prompt_range_only_for_mixed_batches() -> None:
    from osserve.ops.attention.metadata import AttentionMetadata, TreeMask

    def rng(q_lens: list[int], tree: TreeMask | None = None) -> tuple[int, int] | None:
        return AttentionMetadata(torch.zeros(1), torch.zeros(1), q_lens, [64] * len(q_lens), {}, tree).prompt_range

    assert rng([1, 1, 1]) is None  # decode only
    assert rng([5, 9]) is None  # prompts only: one launch
    assert rng([5, 0, 9]) is None  # no one-token query
    assert rng([1, 5, 1, 9, 1]) == (1, 4)
    assert rng([7, 1]) == (0, 1)
    tree = TreeMask(torch.zeros(1), torch.zeros(1), torch.zeros(1))
    assert rng([1, 5], tree) is None  # trees take the prefill kernel whole
    # A mixed-step graph: its host lists are the capture's; the replays split on the device.
    graph = AttentionMetadata(torch.zeros(6), torch.zeros(5), [64], [4096], {}, replays_mixed=True)
    assert graph.prompt_range == (0, 5)


def test_mixed_batch_split_passes_slices_only_where_alignment_is_not_specialised(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A mixed batch's split hands the prefill kernel its per-sequence tables from the first prompt
    on (seq_lens[lo:], ...): their alignment varies from step to step, so the kernel must not
    specialise on it (else a served step compiles it anew: engine/compile_log.py). Every other
    pointer, the tree's and the scales' placeholders included, stays 16-byte aligned."""
    from osserve.ops.attention import paged_triton

    kernel = paged_triton._prefill_kernel
    launches: list[tuple[object, ...]] = []

    class Recorder:
        def __getitem__(self, grid: object):  # type: ignore[no-untyped-def]
            return lambda *args, **kwargs: launches.append(args)

    monkeypatch.setattr(paged_triton, "_prefill_kernel", Recorder())
    seqs = MIXED_SPLIT_BATCHES["decodes_first"]
    lo, _ = prompt_range(seqs)
    assert lo % 4 != 0  # seq_lens[lo:] (int32) is not 16-byte aligned: the case under test
    case = make_case(seqs, 4, 2, 16, 4, None, device=DEVICE, seed=3)
    run_kernel(case, is_decode=False, prompt_range=(lo, len(seqs)))
    (args,) = launches
    pointers = {name: a for name, a in zip(kernel.arg_names, args, strict=False) if isinstance(a, torch.Tensor)}
    unaligned = {name for name, t in pointers.items() if t.data_ptr() % 16}
    assert "seq_lens_ptr" in unaligned
    # The compiled kernel keeps its options as attributes, the interpreted one in `kwargs`.
    options = getattr(kernel, "kwargs", None) or vars(kernel)
    assert unaligned <= set(options["do_not_specialize_on_alignment"]), unaligned
