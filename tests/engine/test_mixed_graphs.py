"""The layout a mixed step is padded to before its CUDA graph replays (engine/worker/mixed_graphs.py):
plain numpy, so it is checked here; the replay itself is checked on the GPU (tests/gpu)."""

from __future__ import annotations

import numpy as np
import pytest

from osserve.engine.worker.mixed_graphs import QUERY_BUCKETS, TOKEN_BUCKETS, MixedGraphs, sequence_layout


def test_real_sequences_then_padding_of_at_most_q_tokens_then_empty() -> None:
    starts, lens = sequence_layout([1, 1, 37, 1], [50, 9, 37, 130], num_tokens=128, max_query=64, num_seqs=10)
    assert starts.tolist() == [0, 1, 2, 39, 40, 104, 128, 128, 128, 128, 128]
    assert lens.tolist() == [50, 9, 37, 130, 0, 0, 0, 0, 0, 0]
    q_lens = np.diff(starts)
    assert q_lens[4:].max() <= 64 and q_lens.sum() == 128  # every padded row has a sequence


def test_no_padding_when_the_step_fills_the_shape() -> None:
    starts, lens = sequence_layout([16, 16], [16, 40], num_tokens=32, max_query=16, num_seqs=3)
    assert starts.tolist() == [0, 16, 32, 32] and lens.tolist() == [16, 40, 0]


def test_a_layout_that_does_not_fit_is_refused() -> None:
    with pytest.raises(AssertionError):
        sequence_layout([1] * 4, [5] * 4, num_tokens=128, max_query=16, num_seqs=8)  # 124 padded rows: 8 seqs
    with pytest.raises(AssertionError):
        sequence_layout([70], [70], num_tokens=128, max_query=64, num_seqs=8)  # a query longer than Q


def shapes(num_seqs: int) -> MixedGraphs:
    graphs = MixedGraphs.__new__(MixedGraphs)  # shape_for reads only num_seqs
    graphs.num_seqs = num_seqs
    return graphs


def test_shape_for_picks_the_smallest_bucket_that_holds_the_step() -> None:
    g = shapes(256 + TOKEN_BUCKETS[-1] // QUERY_BUCKETS[0])
    assert g.shape_for([1] * 229 + [15]) == (256, 16)
    assert g.shape_for([1] * 229 + [63, 15]) == (384, 64)
    assert g.shape_for([200]) == (256, 256)
    assert g.shape_for([1] * 200 + [300]) is None  # a prompt chunk longer than the largest Q: eager
    assert g.shape_for([1] * 256 + [256] * 3) == (1024, 256)  # exactly the largest T
    assert g.shape_for([1] * 256 + [256] * 4) is None  # more tokens than the largest T: eager
    assert shapes(18).shape_for([1] * 10 + [16]) == (128, 16)  # 11 sequences + 7 of padding
    assert shapes(17).shape_for([1] * 10 + [16]) is None  # the padding sequences would not fit
