"""The kernel policy through the engine (CPU, tiny checkpoint): decided at load, held by the runner,
entered around every call into the model, named in the memory-plan log line; `--portable-kernels`
reaches it from the command line."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from osserve import cli
from osserve.commands.flags import prepare_argv
from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.load import EngineArgs, build_engine
from osserve.ops.policy import decide, kernel_policy


def test_the_flag_reaches_the_engine_args() -> None:
    ns = cli.build_parser().parse_args(prepare_argv(["serve", "openai/gpt-oss-20b", "--portable-kernels"]))
    assert EngineArgs.from_namespace(ns).portable_kernels
    ns = cli.build_parser().parse_args(prepare_argv(["serve", "openai/gpt-oss-20b"]))
    assert not EngineArgs.from_namespace(ns).portable_kernels


def test_the_runner_enters_its_policy_around_the_model(tiny_checkpoint: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="osserve"):
        engine = build_engine(EngineArgs(model=str(tiny_checkpoint), device="cpu", max_model_len=512,
                                         portable_kernels=True))
    plan = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("memory plan"))
    assert plan.endswith(engine.runner.policy.describe()) and "portable Triton" in plan
    assert any(r.getMessage().startswith("KV cache: ") for r in caplog.records)

    # On the CPU every op takes its reference path whatever the policy; the one the model's kernels
    # would read is the runner's, inside each step only.
    engine.runner.policy = decide((8, 6))
    seen: list[str] = []
    forward = engine.runner.model.forward

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(kernel_policy(torch.device("cuda")).reason)
        return forward(*args, **kwargs)

    engine.runner.model.forward = spy  # type: ignore[method-assign]
    engine.add_request("r", [1, 2, 3], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    assert seen and set(seen) == {"sm_86"}
    assert kernel_policy(torch.device("cpu")).capability is None  # not left behind after the step
