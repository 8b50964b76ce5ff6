"""Triton paged attention vs the reference at gpt-oss shapes (64 q / 8 kv heads, head_dim 64,
window 128, block 16), bf16 against the reference on float32 copies."""

from __future__ import annotations

import random

import pytest
import torch

from tests.ops.attention_cases import Case, make_case, prompt_range, reference, rel_err

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
H, KVH, D, BS, WINDOW = 64, 8, 64, 16, 128
TOL = 1e-2


def run(case, is_decode: bool, **kw) -> torch.Tensor:
    from osserve.ops.attention.paged_triton import paged_attention_triton

    qsl, seq_lens = case.device_meta()
    out = torch.full_like(case.q, float("nan"))
    q_lens = [b - a for a, b in zip(case.query_start_loc, case.query_start_loc[1:], strict=False)]
    paged_attention_triton(case.q, case.k_cache, case.v_cache, case.sinks, qsl, seq_lens,
                           case.block_tables, case.scale, case.window, max(q_lens),
                           max(case.seq_lens), is_decode, out=out, **kw)
    torch.cuda.synchronize()
    return out


def check(case, is_decode: bool, **kw) -> None:
    out = run(case, is_decode, **kw)
    assert not out.isnan().any()
    err = rel_err(out, reference(case))
    assert err < TOL, err


@pytest.mark.parametrize("window", [None, WINDOW])
@pytest.mark.parametrize("batch", [1, 7, 64])
@pytest.mark.parametrize("num_splits", [None, 1, 16])
def test_decode(window: int | None, batch: int, num_splits: int | None) -> None:
    check(decode_case(window, batch, num_splits), True, num_splits=num_splits)


def decode_case(window: int | None, batch: int, num_splits: int | None) -> Case:
    """`batch` decodes: contexts at the block and window edges, then random up to 8k."""
    rng = random.Random(batch * 31 + (window or 0) + (num_splits or 0))
    lens = [1, 127, 128, 129, 8192] + [rng.randint(1, 8192) for _ in range(batch)]
    return make_case([(n, 1) for n in lens[:batch]], H, KVH, D, BS, window, torch.bfloat16, "cuda",
                     outside="poison" if batch % 2 else "hole", seed=batch)


PREFILL = {
    "one_2k": [(2048, 2048)],
    "chunked": [(4000, 512), (300, 300), (129, 1), (8192, 1), (130, 3)],
    "mixed16": [(n, q) for n, q in zip([17, 128, 1000, 257, 64, 8000, 1, 3000] * 2,
                                       [17, 1, 200, 129, 64, 1, 1, 77] * 2, strict=True)],
}


@pytest.mark.parametrize("window", [None, WINDOW])
@pytest.mark.parametrize("batch", list(PREFILL))
def test_prefill(window: int | None, batch: str) -> None:
    case = make_case(PREFILL[batch], H, KVH, D, BS, window, torch.bfloat16, "cuda",
                     outside="poison", seed=len(batch))
    check(case, False)


@pytest.mark.parametrize("window", [None, WINDOW])
@pytest.mark.parametrize("batch", ["chunked", "mixed16"])
@pytest.mark.parametrize("whole", [False, True])
def test_mixed_batch_split(window: int | None, batch: str, whole: bool) -> None:
    """A mixed batch's decodes by the decode kernel, its prompt chunks by the prefill kernel over
    the range that holds them, or (whole: as a captured graph runs it) over every sequence."""
    seqs = PREFILL[batch]
    split = (0, len(seqs)) if whole else prompt_range(seqs)
    case = make_case(seqs, H, KVH, D, BS, window, torch.bfloat16, "cuda", outside="poison", seed=len(batch) + 1)
    check(case, False, prompt_range=split)


@pytest.mark.parametrize("window", [None, WINDOW])
def test_decode_cuda_graph_replays_at_new_lengths(window: int | None) -> None:
    """Capture at short lengths, grow the sequences in place, replay: still right."""
    from osserve.ops.attention.paged_triton import paged_attention_triton

    seqs = [(n, 1) for n in (4000, 6000, 8000, 500)]
    case = make_case(seqs, H, KVH, D, BS, window, torch.bfloat16, "cuda", seed=9)
    qsl, seq_lens = case.device_meta()
    short = torch.tensor([100, 37, 300, 1], dtype=torch.int32, device="cuda")
    seq_lens_buf = short.clone()
    out = torch.empty_like(case.q)
    call = lambda: paged_attention_triton(  # noqa: E731
        case.q, case.k_cache, case.v_cache, case.sinks, qsl, seq_lens_buf, case.block_tables,
        case.scale, window, 1, 8192, True, out=out)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()  # compile outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    seq_lens_buf.copy_(seq_lens)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(out, reference(case)) < TOL


def test_dispatch_through_metadata() -> None:
    from osserve.ops.attention.dispatch import paged_attention
    from osserve.ops.attention.kv_format import KVCache
    from osserve.ops.attention.metadata import AttentionMetadata, BlockTables

    seqs = [(300, 300), (1000, 1), (50, 7)]
    case = make_case(seqs, H, KVH, D, BS, WINDOW, torch.bfloat16, "cuda", seed=4)
    qsl, seq_lens = case.device_meta()
    meta = AttentionMetadata(qsl, seq_lens, [q for _, q in seqs], case.seq_lens,
                             {"sliding": BlockTables(case.block_tables, torch.empty(0))})
    out = paged_attention(case.q, KVCache(case.k_cache, case.v_cache), case.sinks, meta, meta.groups["sliding"],
                          case.scale, WINDOW)
    assert rel_err(out, reference(case)) < TOL
