"""The grammars in processes of their own (structured/grammar_process.py): the same outputs as in
the engine's process, rejections reported with the next masks, a dead child replaced (only its
requests end), a server stopped by SIGTERM leaving nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import jsonschema
import pytest
import torch

from osserve.engine.core.sampling_params import RETURN_TOKEN
from osserve.engine.load import EngineArgs, build_engine
from osserve.harmony.stream import parse_completion
from osserve.structured import grammar_process
from osserve.structured.grammar import grammar_text
from osserve.structured.grammar_process import ENV, GrammarProcessError, RemoteGrammars
from osserve.structured.matchers import Grammars
from osserve.structured.spec import StructuredOutputs
from osserve.tokenizer import load_tokenizer
from tests.server.serving import free_port, wait_until_healthy
from tests.structured.test_engine_structured import SCHEMA, TIME, WEATHER, prompt, run, sampled

VOCAB = 201088


def requests() -> dict:  # type: ignore[type-arg]
    json_turn = StructuredOutputs(json_schema=SCHEMA, harmony=True)
    required = StructuredOutputs(harmony=True, tools=[WEATHER, TIME], tool_choice="required")
    digits = StructuredOutputs(regex=r"[0-9]{2,6}")
    return ({f"json{s}": (prompt(s), sampled(json_turn, s, max_tokens=96)) for s in range(4)}
            | {f"tool{s}": (prompt(s), sampled(required, s, max_tokens=48)) for s in range(2)}
            | {f"re{s}": (prompt(s), sampled(digits, s, max_tokens=8)) for s in range(2)}
            | {"free": (prompt(1), sampled(None, 9, max_tokens=24))})  # type: ignore[arg-type]


def test_outputs_equal_those_of_the_engines_own_process(tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch,
                                                        ) -> None:
    outs = {}
    for setting, shards in (("0", 1), ("1", 2)):  # two processes: one alike, with parts to join
        monkeypatch.setenv(ENV, setting)
        monkeypatch.setattr(grammar_process, "SHARDS", shards)
        engine = build_engine(EngineArgs(model=str(tiny_checkpoint), device="cpu", max_model_len=1024))
        if setting == "1":
            assert isinstance(engine.grammars, RemoteGrammars) and len(engine.grammars._children) == shards
        else:
            assert isinstance(engine.grammars, Grammars)
        outs[setting, shards] = run(engine, requests())
        assert not engine.grammars.states and not engine.requests
        del engine
    assert outs["1", 2] == outs["0", 1]
    for s in range(4):  # and they are what they should be
        ids = outs["1", 2][f"json{s}"]
        assert ids[-2] == RETURN_TOKEN
        jsonschema.validate(json.loads(parse_completion(ids[:-1]).content), SCHEMA)


@pytest.fixture(scope="module")
def remote() -> RemoteGrammars:
    return RemoteGrammars(VOCAB, max_rows=4, lanes=1, shards=2)  # x and y below go to one each


def start_digits(grammars: RemoteGrammars, rid: str) -> None:
    spec = StructuredOutputs(regex=r"[0-9]{2,6}")
    text = grammar_text(spec, 8)
    assert text is not None
    grammars.start(rid, text)
    assert grammars.ready(wait=True) == [(rid, None)]
    assert rid in grammars.states


def test_a_deferred_rejection_comes_back_with_the_next_masks(remote: RemoteGrammars) -> None:
    letter, digit = load_tokenizer().encode("a")[0], load_tokenizer().encode("7")[0]
    start_digits(remote, "x")
    start_digits(remote, "y")
    assert remote.accept({"x": letter, "y": digit}, defer=True) == set()  # nothing known yet
    fill = remote.begin_masks(["x", "y"])
    assert fill is not None and fill.in_background
    masks = remote.end_masks(fill)
    assert masks.rejected == ["x"] and "rejected" in (remote.failure("x") or "")
    assert masks.rows == [1]  # only y's row is filled: x's grammar failed
    assert isinstance(masks.bits, torch.Tensor)  # the second process's part alone
    allowed = masks.bits[0]
    assert allowed[digit // 32] >> (digit % 32) & 1 and not allowed[letter // 32] >> (letter % 32) & 1
    assert remote.accept({"y": letter}) == {"y"}  # fed at once: known at once
    remote.drop("x")
    remote.drop("y")
    assert not remote.states and remote.failure("x") is None


def test_two_processes_rows_come_as_two_parts(remote: RemoteGrammars) -> None:
    tokenizer = load_tokenizer()
    start_digits(remote, "a")
    start_digits(remote, "b")
    start_digits(remote, "c")
    assert {remote._shard[rid] is remote._children[0] for rid in "abc"} == {True, False}  # both get some
    remote.accept({"a": tokenizer.encode("1")[0], "b": tokenizer.encode("2")[0], "c": tokenizer.encode("3")[0]},
                  defer=True)
    masks = remote.masks(["c", "b", "a"])
    assert masks is not None and sorted(masks.rows) == [0, 1, 2] and isinstance(masks.bits, list)
    assert [len(part) for part in masks.bits] in ([2, 1], [1, 2])
    stacked = torch.cat(masks.bits)
    digit, letter = tokenizer.encode("7")[0], tokenizer.encode("a")[0]
    for slot in range(3):  # each row: a digit may follow, a letter may not
        assert stacked[slot, digit // 32] >> (digit % 32) & 1
        assert not stacked[slot, letter // 32] >> (letter % 32) & 1
    for rid in "abc":
        remote.drop(rid)
    assert not remote.states


def test_masks_say_when_the_last_process_took_the_step_up_and_how_long_it_worked(remote: RemoteGrammars) -> None:
    start_digits(remote, "p")
    before = time.perf_counter()
    fill = remote.begin_masks(["p"])
    assert fill is not None
    time.sleep(0.05)  # the loop's own work meanwhile (the step before's outputs)
    masks = remote.end_masks(fill)
    after = time.perf_counter()
    assert masks.process_times is not None
    started, worked = masks.process_times
    # One clock for both processes: the child's times fall inside the loop's.
    assert 0 < started and 0 < worked and started + worked <= after - before
    assert masks.waited <= after - before - 0.05
    remote.drop("p")


def test_a_dead_child_is_replaced_and_only_its_requests_end(monkeypatch: pytest.MonkeyPatch) -> None:
    grammars = RemoteGrammars(VOCAB, max_rows=4, lanes=1, shards=2)
    digit = load_tokenizer().encode("7")[0]
    start_digits(grammars, "a")  # the first process
    start_digits(grammars, "b")  # the second
    first = grammars._children[0]
    first.proc.kill()
    first.proc.wait()
    grammars.accept({"a": digit, "b": digit}, defer=True)
    masks = grammars.masks(["a", "b"])
    assert masks is not None and masks.rejected == ["a"] and masks.rows == [1]  # b's row, from the second
    assert "died" in (grammars.failure("a") or "")
    assert grammars._children[0] is not first and grammars._children[0].proc.poll() is None
    grammars.drop("a")
    start_digits(grammars, "c")  # the first again: its new process
    masks = grammars.masks(["c", "b"])
    assert masks is not None and sorted(masks.rows) == [0, 1] and not masks.rejected
    # A request still compiling when its process dies is reported by ready, failed.
    text = grammar_text(StructuredOutputs(regex=r"[0-9]{2,6}"), 8)
    assert text is not None
    grammars.start("d", text)  # the second process
    second = grammars._children[1]
    second.proc.kill()
    second.proc.wait()
    done = dict(grammars.ready(wait=True))
    assert "died" in (done["d"] or "") and "d" not in grammars.states
    masks = grammars.masks(["c", "b"])  # b was the second's: it ends; c goes on
    assert masks is not None and masks.rejected == ["b"] and masks.rows == [0]
    # Processes that keep dying (more than MAX_DEATHS in a minute) stop it with a clear error.
    monkeypatch.setattr(RemoteGrammars, "MAX_DEATHS", 2)
    grammars._children[0].proc.kill()
    grammars._children[0].proc.wait()
    with pytest.raises(GrammarProcessError, match="died 3 times"):
        grammars.masks(["c"])


def test_the_engine_goes_on_when_a_grammar_process_dies(tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch,
                                                        ) -> None:
    """A constrained request whose process dies mid-answer ends with finish reason "grammar" and
    says why; a plain one beside it finishes, and a new constrained one is served valid."""
    monkeypatch.setenv(ENV, "1")
    monkeypatch.setattr(grammar_process, "SHARDS", 1)
    engine = build_engine(EngineArgs(model=str(tiny_checkpoint), device="cpu", max_model_len=1024))
    assert isinstance(engine.grammars, RemoteGrammars)
    json_turn = StructuredOutputs(json_schema=SCHEMA, harmony=True)
    engine.add_request("bound", prompt(0), sampled(json_turn, 1, max_tokens=96))
    engine.add_request("free", prompt(1), sampled(None, 2, max_tokens=24))  # type: ignore[arg-type]
    finished: dict[str, tuple[str | None, str | None]] = {}
    steps = 0
    while engine.has_unfinished():
        if steps == 6:
            engine.grammars._children[0].proc.kill()
        for d in engine.step():
            if d.finished:
                finished[d.request_id] = (d.finish_reason, d.error)
        steps += 1
    assert finished["bound"][0] == "grammar" and "died" in (finished["bound"][1] or "")
    assert finished["free"][0] == "length"
    outs = run(engine, {"again": (prompt(2), sampled(json_turn, 3, max_tokens=96))})
    ids = outs["again"]
    assert ids[-2] == RETURN_TOKEN
    jsonschema.validate(json.loads(parse_completion(ids[:-1]).content), SCHEMA)


def test_a_server_stopped_by_sigterm_to_its_group_leaves_nothing(tiny_checkpoint: Path) -> None:
    """systemd stops a unit by SIGTERM to each of its processes: the engine's process still runs
    its finalizers (the grammar processes stopped, their shared memory unlinked: Python's resource
    tracker warns of a leak otherwise), and no process of the group is left."""
    port = free_port()
    cmd = [sys.executable, "-m", "osserve.cli", "serve", "--model", str(tiny_checkpoint), "--port", str(port),
           "--engine-process", "--max-model-len", "1024"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, ENV: "1"})
    try:
        wait_until_healthy(proc, f"http://127.0.0.1:{port}", 120)
        body = {"model": tiny_checkpoint.name, "prompt": "Say it", "max_tokens": 8,
                "response_format": {"type": "json_object"}}
        assert httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=60).status_code == 200
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _group_alive(proc.pid):
            time.sleep(0.2)
        assert not _group_alive(proc.pid), out
    finally:
        if _group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    assert "leaked shared_memory" not in out and "Traceback" not in out, out


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
