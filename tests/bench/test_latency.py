"""`osserve bench latency`'s measurement on the tiny checkpoint (CPU): prefill until every first
token, then one decode step per call, with and without async scheduling."""

from __future__ import annotations

from pathlib import Path

import pytest

from osserve.bench.latency import run_once
from osserve.engine.load import EngineArgs, build_engine


@pytest.mark.parametrize("no_async", [False, True], ids=["async", "sync"])
def test_run_once_counts_decode_tokens(tiny_checkpoint: Path, no_async: bool) -> None:
    engine = build_engine(EngineArgs(model=str(tiny_checkpoint), device="cpu", max_model_len=512,
                                     no_async_scheduling=no_async))
    r = run_once(engine, batch=3, input_len=30, output_len=6, seed=0)  # one prefill step
    assert round(r.decode_tok_s * r.decode_s) == 3 * 5  # every token after each first one
    assert r.prefill_s > 0 and r.decode_s > 0 and r.tpot_median_ms > 0
    assert r.prefill_tok_s == pytest.approx(90 / r.prefill_s)
    assert not engine.has_unfinished()
