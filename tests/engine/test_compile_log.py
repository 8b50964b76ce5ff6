"""engine/compile_log.py: which compiles it warns of, and what it names (Triton's hook arguments
are built here as Triton 3.6 passes them: the GPU test test_warm_up_compiles_what_the_first_requests_need
runs the real hook)."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
import triton

from osserve.engine.compile_log import CompileLog, specialisation

PARAMS = [SimpleNamespace(name=n) for n in ("x_ptr", "n", "BLOCK")]
KERNEL = SimpleNamespace(module="osserve.ops.example", name="_kernel", jit_function=SimpleNamespace(params=PARAMS))


def compile_args(aligned: bool, block: int = 64) -> dict[str, Any]:
    return {"signature": {"x_ptr": "*bf16", "n": "i32", "BLOCK": "constexpr"}, "constants": {(2,): block},
            "configs": [{(0,): [["tt.divisibility", 16]] if aligned else [], (1,): []}]}


def test_specialisation_names_arguments() -> None:
    assert specialisation(KERNEL.jit_function, compile_args(True)) == {
        "x_ptr": "*bf16 tt.divisibility=16", "n": "i32", "BLOCK": "=64"}


def test_warns_only_after_the_warm_up_naming_the_difference(caplog: pytest.LogCaptureFixture) -> None:
    log = CompileLog()
    with caplog.at_level(logging.WARNING, logger="osserve"):
        log.hook(fn=KERNEL, compile=compile_args(True))
        log.hook(fn=KERNEL, compile=compile_args(True, block=128))
        assert not caplog.records
        log.serving = True
        log.hook(fn=KERNEL, compile=compile_args(False))
    assert len(caplog.records) == 1
    text = caplog.records[0].getMessage()
    assert "osserve.ops.example._kernel" in text
    # the closest earlier compile is the one with BLOCK=64: only the alignment differs from it
    assert "x_ptr: *bf16 tt.divisibility=16 before, *bf16 now" in text
    assert "BLOCK" not in text


def test_a_kernel_new_after_the_warm_up_lists_its_constants(caplog: pytest.LogCaptureFixture) -> None:
    log = CompileLog(serving=True)
    with caplog.at_level(logging.WARNING, logger="osserve"):
        log.hook(fn=KERNEL, compile=compile_args(True, block=32))
    assert len(caplog.records) == 1 and "first compile; BLOCK=32" in caplog.records[0].getMessage()


def test_install_sets_tritons_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triton.knobs.runtime, "jit_post_compile_hook", None)
    log = CompileLog.install()
    assert triton.knobs.runtime.jit_post_compile_hook == log.hook
