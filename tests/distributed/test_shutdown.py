"""Stopping a tensor-parallel engine never waits on its communicator for good: after CUDA graphs
captured its collectives, NCCL's abort did not return on either rank (2 x H200, 2026-11-26: rank
0's was still waiting 4 minutes later), so each abort is waited for at most ABORT_WAIT_S."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest
import torch

from osserve.distributed.collectives import ABORT_WAIT_S, bounded
from osserve.distributed.parallel_runner import ParallelRunner
from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.load import EngineArgs, build_engine


def test_a_call_that_never_returns_is_left_after_its_bound(caplog: pytest.LogCaptureFixture) -> None:
    never = threading.Event()
    start = time.monotonic()
    with caplog.at_level(logging.INFO, logger="osserve"):
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
def test_a_stopped_engine_leaves_no_worker_behind(tiny_checkpoint: Path) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    engine = build_engine(EngineArgs(model=str(tiny_checkpoint), device="cpu", max_model_len=256,
                                     tensor_parallel_size=2))
    runner = engine.runner
    assert isinstance(runner, ParallelRunner)
    (worker,) = runner.ranks.pool.processes.values()
    try:
        engine.add_request("r", list(range(100, 120)), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
        start = time.monotonic()
        runner.shutdown()
        assert time.monotonic() - start < ABORT_WAIT_S
        assert worker.poll() == 0  # it exited on STOP, not terminated
        runner.shutdown()  # a second stop (the one at exit) does nothing
    finally:
        runner.shutdown()
        torch.set_num_threads(before)
