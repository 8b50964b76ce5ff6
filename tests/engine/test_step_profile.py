"""The step loop's profile: windows of it for the log, and the parts the engine times around its
steps (the start's admitting, the whole step, the caller's time between steps)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.load import EngineArgs, build_engine
from osserve.engine.step_profile import ProfileLog, StepProfile


def test_a_window_is_what_came_after_the_copy() -> None:
    profile = StepProfile(every=7)
    profile.add(10, 0.001, 0.002, 0.003)
    earlier = StepProfile(**vars(profile))
    profile.add(30, 0.004, 0.005, 0.006, has_prefill=True)
    profile.between += 0.5
    window = profile.since(earlier)
    assert (window.steps, window.requests, window.steps_with_prefill, window.every) == (1, 30, 1, 7)
    assert window.schedule == pytest.approx(0.004) and window.between == pytest.approx(0.5)
    assert "mean batch 30.0" in window.summary() and "between steps 500.00" in window.summary()


def test_the_summary_splits_the_grammar_processes_reply_only_where_there_is_one() -> None:
    profile = StepProfile()
    profile.add(4, 0.0, 0.0, 0.0)
    profile.grammar, profile.mask_wait = 0.003, 0.002
    assert "waiting for the masks 2.00)" in profile.summary()  # the grammars in the engine's process
    profile.process_start, profile.process_work = 0.0005, 0.0025
    assert "took the step up after 0.50 and worked 2.50)" in profile.summary()


def test_the_log_says_each_window_and_starts_again_after_a_reset(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("test-step-profile")
    profile_log = ProfileLog(logger)
    profile = StepProfile(every=2)
    with caplog.at_level(logging.INFO, logger="test-step-profile"):
        for batch in (10, 10, 40, 40, 40):
            profile.add(batch, 0.0, 0.0, 0.0)
            profile_log.after_step(profile)
            if profile.steps == 4:  # a call that ran no step: no empty window logged
                profile_log.after_step(profile)
        fresh = StepProfile(every=2)  # the engine's reset_stats (after the warm-up) makes a new one
        for batch in (4, 4):
            fresh.add(batch, 0.0, 0.0, 0.0)
            profile_log.after_step(fresh)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert lines[0].startswith("engine: steps 1-2: 2 steps") and "mean batch 10.0" in lines[0]
    assert lines[1].startswith("engine: steps 3-4: 2 steps") and "mean batch 40.0" in lines[1]
    assert lines[2].startswith("engine: steps 1-2: 2 steps") and "mean batch 4.0" in lines[2]


def test_the_engine_times_its_steps_and_the_time_between_them(tiny_checkpoint: Path) -> None:
    engine = build_engine(EngineArgs(model=str(tiny_checkpoint), device="cpu", max_model_len=512))
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    engine.add_request("a", list(range(100, 140)), params)
    calls = 0
    while engine.has_unfinished():
        engine.step()
        calls += 1
        if engine.has_unfinished():
            time.sleep(0.01)  # the caller's work between steps (a server sends the deltas)
    profile = engine.profile
    assert 0 < profile.steps <= calls  # (with async scheduling the last call only finishes a step)
    parts = profile.schedule + profile.launch + profile.gpu_wait + profile.grammar + profile.post + profile.admit
    assert profile.in_step >= parts > 0
    assert 0.01 * (calls - 1) <= profile.between < 0.01 * (calls - 1) + 0.5
    # Time with no request left is the server waiting for work: not between steps.
    before = profile.between
    time.sleep(0.3)
    engine.add_request("b", list(range(200, 240)), params)
    engine.step()
    assert profile.between == before
