"""Stopping a tensor-parallel engine never waits on a communicator for good. NCCL's abort returns
once every rank has aborted its own, so rank 0 tells the workers to stop, aborts its end while
they abort theirs, and only then waits for them to exit; and no abort is waited for longer than
ABORT_WAIT_S (2 x H200, 2026-11-26: rank 0's abort, after its worker had exited without one, was
still waiting 4 minutes later)."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest
import torch

from osserve.distributed.collectives import bounded
from osserve.distributed.parallel_runner import ParallelRunner
from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.load import EngineArgs, build_engine


def test_a_call_that_never_returns_is_left_after_its_bound(caplog: pytest.LogCaptureFixture) -> None:
    never = threading.Event()
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="osserve"):
        assert not bounded(never.wait, 0.3, "aborting a stuck communicator")
    assert 0.3 <= time.monotonic() - start < 2
    assert "aborting a stuck communicator did not return within" in caplog.text


def test_a_call_that_returns_or_raises_is_waited_for() -> None:
    done: list[int] = []
    assert bounded(lambda: done.append(1), 5, "a quick call")
    assert done == [1]

    def fails() -> None:
        raise RuntimeError("the group is half gone")

    assert bounded(fails, 5, "a failing call")  # logged at debug level, not raised


@pytest.mark.timeout(120)
def test_every_rank_aborts_before_rank_0_waits_for_the_workers(tiny_checkpoint: Path) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    engine = build_engine(EngineArgs(model=str(tiny_checkpoint), device="cpu", max_model_len=256,
                                     tensor_parallel_size=2))
    runner = engine.runner
    assert isinstance(runner, ParallelRunner)
    ranks = runner.ranks
    (worker,) = ranks.pool.processes.values()
    calls: list[str] = []

    def recorded(name: str, original):  # type: ignore[no-untyped-def]
        def call() -> None:
            calls.append(name)
            original()
        return call

    ranks.pool.stop = recorded("stop the workers", ranks.pool.stop)  # type: ignore[method-assign]
    ranks.group.shutdown = recorded("abort rank 0's end", ranks.group.shutdown)  # type: ignore[method-assign]
    ranks.pool.wait_stopped = recorded("wait for the workers", ranks.pool.wait_stopped)  # type: ignore[method-assign]
    try:
        engine.add_request("r", list(range(100, 120)), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
        start = time.monotonic()
        runner.shutdown()
        assert time.monotonic() - start < 10
        assert calls == ["stop the workers", "abort rank 0's end", "wait for the workers"]
        assert worker.poll() == 0  # it aborted its own end and exited cleanly, not terminated
    finally:
        runner.shutdown()
        torch.set_num_threads(before)
