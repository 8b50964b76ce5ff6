"""Structured outputs through the engine on the tiny random-weight checkpoint (CPU). A random model
follows no format by itself: whatever is valid here, the grammar made so."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from osserve.engine import engine as engine_module
from osserve.engine.core.sampling_params import CALL_TOKEN, RETURN_TOKEN, SamplingParams
from osserve.engine.engine import LLMEngine
from osserve.engine.load import EngineArgs, build_engine
from osserve.harmony.render import ChatMessage, render_chat
from osserve.harmony.stream import parse_completion
from osserve.structured.grammar import check
from osserve.structured.matchers import Grammars
from osserve.structured.spec import StructuredOutputs, ToolSpec

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["answer", "ok", "unit"],
          "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 999}, "ok": {"type": "boolean"},
                         "unit": {"enum": ["km", "mi"]}}}
WEATHER = ToolSpec("get_weather", {"type": "object", "additionalProperties": False, "required": ["city", "days"],
                                   "properties": {"city": {"type": "string", "maxLength": 12},
                                                  "days": {"type": "integer", "minimum": 1, "maximum": 7}}})
TIME = ToolSpec("get_time", {"type": "object", "required": ["tz"], "additionalProperties": False,
                             "properties": {"tz": {"enum": ["UTC", "CET", "JST"]}}})
SEEDS = range(8)
MAX_TOKENS = 64
QUESTIONS = ["What is 37 + 45?", "Convert 5 km to miles.", "How many r in strawberry?", "Hi!", "2+2?",
             "Weather in Oslo?", "Time in Tokyo?", "Name a color."]


@pytest.fixture(scope="module")
def engine(tiny_checkpoint: Path) -> LLMEngine:
    return build_engine(EngineArgs(model=str(tiny_checkpoint), device="cpu", max_model_len=1024))


def prompt(i: int = 0) -> list[int]:
    return render_chat([ChatMessage("user", QUESTIONS[i % len(QUESTIONS)])], reasoning_effort="low").token_ids


def run(engine: LLMEngine, requests: dict[str, tuple[list[int], SamplingParams]]) -> dict[str, list[int]]:
    """Everything submitted at once; each request's output ids, and its last delta's finish reason."""
    for rid, (ids, params) in requests.items():
        if params.structured is not None:
            check(params.structured, params.max_tokens)
        engine.add_request(rid, ids, params)
    out: dict[str, list[int]] = {rid: [] for rid in requests}
    while engine.has_unfinished():
        for d in engine.step():
            out[d.request_id].extend(d.new_token_ids)
            if d.finished:
                out[d.request_id].append(-1 if d.finish_reason == "grammar" else 0)  # the finish, marked
    return out


def sampled(spec: StructuredOutputs, seed: int, temperature: float = 1.0, **kw) -> SamplingParams:  # type: ignore[no-untyped-def]
    return SamplingParams(temperature=temperature, seed=seed, max_tokens=kw.pop("max_tokens", MAX_TOKENS),
                          structured=spec, **kw)


def varied(spec: StructuredOutputs, n: int = len(SEEDS), max_tokens: int = MAX_TOKENS,
           ) -> dict[str, tuple[list[int], SamplingParams]]:
    """n requests that differ: greedy on different questions, and two sampled with their own seeds
    (greedy keeps the CPU's work small; sampling proves the masks hold for drawn tokens too)."""
    reqs = {f"g{i}": (prompt(i), sampled(spec, i, temperature=0.0, max_tokens=max_tokens)) for i in range(n - 2)}
    return reqs | {f"s{i}": (prompt(0), sampled(spec, i, max_tokens=max_tokens)) for i in range(2)}


def test_json_schema_answers_validate_for_every_seed(engine: LLMEngine) -> None:
    spec = StructuredOutputs(json_schema=SCHEMA, harmony=True)
    outs = run(engine, varied(spec, max_tokens=128))  # room for the reasoning's half and a spaced answer
    for ids in outs.values():
        assert ids[-2] == RETURN_TOKEN
        parsed = parse_completion(ids[:-1])
        jsonschema.validate(json.loads(parsed.content), SCHEMA)
        assert not parsed.tool_calls
    assert len({tuple(ids) for ids in outs.values()}) > 1  # the seeds did differ


def test_raw_completion_formats(engine: LLMEngine, tiny_checkpoint: Path) -> None:
    hello = engine.tokenizer.encode("Hello")
    specs = {"obj": StructuredOutputs(json_object=True), "re": StructuredOutputs(regex=r"[a-f0-9]{4}-[0-9]{2}"),
             "choice": StructuredOutputs(choice=["alpha", "beta", "gamma"]),
             "lark": StructuredOutputs(grammar='start: "(" /[0-9]{1,3}/ ("," /[0-9]{1,3}/)* ")"')}
    outs = run(engine, {f"{k}{s}": (hello, sampled(spec, s, max_tokens=48)) for k, spec in specs.items()
                        for s in range(3)})
    for rid in outs:  # each ends at its grammar's end, with a stop token: no free text after it
        assert outs[rid][-2] in (RETURN_TOKEN, CALL_TOKEN) or rid.startswith("obj"), rid
    import re

    closed = 0
    for rid, ids in outs.items():
        text = engine.tokenizer.decode([t for t in ids[:-1] if t not in (RETURN_TOKEN, CALL_TOKEN)])
        if rid.startswith("obj"):
            # A random model's free-form strings may outlast max_tokens: a cut object is a prefix.
            assert text.startswith("{"), text
            if ids[-2] in (RETURN_TOKEN, CALL_TOKEN):
                assert isinstance(json.loads(text), dict), text
                closed += 1
        elif rid.startswith("re"):
            assert re.fullmatch(r"[a-f0-9]{4}-[0-9]{2}", text), text
        elif rid.startswith("choice"):
            assert text in ("alpha", "beta", "gamma"), text
        else:
            assert re.fullmatch(r"\(\d{1,3}(,\d{1,3})*\)", text), text
    assert closed >= 1

@pytest.mark.parametrize("choice", ["required", "named"])
def test_forced_tool_calls_call_an_allowed_tool_with_valid_arguments(engine: LLMEngine, choice: str) -> None:
    spec = StructuredOutputs(harmony=True, tools=[WEATHER, TIME], tool_choice=choice,  # type: ignore[arg-type]
                             tool_name="get_weather" if choice == "named" else None)
    tools = [f"functions.{t.name}" for t in spec.tools]
    outs = run(engine, varied(spec, max_tokens=96))  # the reasoning gets 48: the call has room
    for ids in outs.values():
        assert ids[-2] == CALL_TOKEN, "the turn must end in a call"
        parsed = parse_completion(ids[:-1])
        assert len(parsed.tool_calls) == 1 and not parsed.content
        call = parsed.tool_calls[0]
        assert f"functions.{call.name}" in tools
        if choice == "named":
            assert call.name == "get_weather"
        schema = WEATHER.parameters if call.name == "get_weather" else TIME.parameters
        jsonschema.validate(json.loads(call.arguments), schema)


def test_constrained_rows_beside_free_ones_change_nothing_for_the_free_ones(engine: LLMEngine) -> None:
    """Greedy free requests give the same tokens alone and beside constrained ones (the masks touch
    only their own rows), and the steps still run ahead (async scheduling)."""
    free = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    ps = {f"f{i}": (engine.tokenizer.encode(f"prompt number {i}"), free) for i in range(3)}
    alone = run(engine, {k: (ids, SamplingParams(**vars(p))) for k, (ids, p) in ps.items()})
    spec = StructuredOutputs(json_schema=SCHEMA, harmony=True)
    before = engine.profile.steps_in_flight
    mixed = run(engine, {**{k: (ids, SamplingParams(**vars(p))) for k, (ids, p) in ps.items()},
                         **{f"c{s}": (prompt(), sampled(spec, s)) for s in range(3)}})
    assert {k: mixed[k] for k in alone} == alone
    assert engine.profile.steps_in_flight > before
    for s in range(3):
        jsonschema.validate(json.loads(parse_completion(mixed[f"c{s}"][:-1]).content), SCHEMA)


def test_preemption_chunked_prefill_and_prefix_cache_keep_greedy_outputs(tiny_checkpoint: Path,
                                                                           engine: LLMEngine) -> None:
    spec = StructuredOutputs(harmony=True, tools=[WEATHER, TIME], tool_choice="required")
    reqs = {f"g{i}": (render_chat([ChatMessage("user", f"Weather in city {i}? " * 40)]).token_ids,  # past the window
                      sampled(spec, 0, temperature=0.0, max_tokens=96)) for i in range(4)}
    reference = run(engine, {k: (ids, SamplingParams(**vars(p))) for k, (ids, p) in reqs.items()})
    tight = build_engine(EngineArgs(model=str(tiny_checkpoint), device="cpu", max_model_len=1024, num_blocks=32,
                                    max_num_batched_tokens=128))
    again = run(tight, {k: (ids, SamplingParams(**vars(p))) for k, (ids, p) in reqs.items()})
    assert again == reference
    assert tight.scheduler.num_preemptions > 0 and tight.kv.stats.prefix_cache_hits > 0
    for ids in reference.values():
        assert ids[-2] == CALL_TOKEN and parse_completion(ids[:-1]).tool_calls


def test_a_dead_end_ends_that_request_alone(engine: LLMEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    fill = Grammars._fill
    calls = {"n": 0}

    def starve_first_row_later(self, lane, matchers, bits, feeds):  # type: ignore[no-untyped-def]
        rejected = fill(self, lane, matchers, bits, feeds)
        calls["n"] += 1
        if calls["n"] == 5:
            bits[0] = 0  # the first constrained row of this step allows nothing
        return rejected

    monkeypatch.setattr(Grammars, "_fill", starve_first_row_later)
    spec = StructuredOutputs(json_schema=SCHEMA, harmony=True)
    outs = run(engine, {"dead": (prompt(), sampled(spec, 1)), "fine": (prompt(), sampled(spec, 2))})
    assert outs["dead"][-1] == -1 and len(outs["dead"]) < 10
    assert outs["fine"][-1] == 0 and outs["fine"][-2] == RETURN_TOKEN
    assert not engine.grammars.states and not engine.requests


def test_a_grammar_that_cannot_be_built_ends_its_request(engine: LLMEngine) -> None:
    bad = SamplingParams(max_tokens=8, structured=StructuredOutputs(regex="(unclosed"))
    engine.add_request("bad", [1, 2, 3], bad)  # not checked first: the engine must cope
    engine.add_request("ok", [1, 2, 3], SamplingParams(max_tokens=4, ignore_eos=True))
    finished = {}
    while engine.has_unfinished():
        finished |= {d.request_id: d for d in engine.step() if d.finished}
    assert finished["bad"].finish_reason == "grammar" and "regex" in (finished["bad"].error or "")
    assert finished["ok"].finish_reason == "length" and finished["ok"].num_output_tokens == 4


def test_abort_while_compiling(engine: LLMEngine) -> None:
    engine.add_request("gone", prompt(), sampled(StructuredOutputs(json_schema=SCHEMA, harmony=True), 0))
    delta = engine.abort("gone")
    assert delta is not None and delta.finish_reason == "abort"
    assert not engine.has_unfinished() and not engine.compiling
    while engine.grammars.num_pending:
        engine.step()  # nothing is left to run: the step drains the finished compile
    assert "gone" not in engine.grammars.states


def test_the_step_scheduled_while_the_masks_fill_changes_no_token(engine: LLMEngine,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine schedules the next step while the grammars fill the masks (engine.py); the tokens
    are those of scheduling it in the next call, as before."""
    spec = StructuredOutputs(json_schema=SCHEMA, harmony=True)
    before = engine.profile.launched_early
    early = run(engine, varied(spec, n=4))  # two greedy, two sampled
    assert engine.profile.launched_early > before
    monkeypatch.setattr(engine_module, "schedule_following", lambda scheduler: None)
    before = engine.profile.launched_early
    assert run(engine, varied(spec, n=4)) == early
    assert engine.profile.launched_early == before


def test_a_request_aborted_after_its_next_forward_was_launched_ends_there(engine: LLMEngine) -> None:
    """An abort between a step launched early and its sampling: the request's row is wasted, its
    output ends at the abort, the others finish valid."""
    spec = StructuredOutputs(json_schema=SCHEMA, harmony=True)
    requests = varied(spec, n=4, max_tokens=128)  # room for the answer, as in the first test
    for rid, (ids, params) in requests.items():
        check(params.structured, params.max_tokens)
        engine.add_request(rid, ids, params)
    out: dict[str, list[int]] = {rid: [] for rid in requests}
    reasons: dict[str, str | None] = {}
    gone, aborted_at = None, 0
    while engine.has_unfinished():
        for d in engine.step():
            out[d.request_id].extend(d.new_token_ids)
            if d.finished:
                reasons[d.request_id] = d.finish_reason
        if gone is None and engine.launched is not None:
            gone = engine.launched.rows[0].request_id
            final = engine.abort(gone)
            assert final is not None and final.finish_reason == "abort"
            aborted_at = len(out[gone])
    assert gone is not None and len(out[gone]) == aborted_at
    assert not engine.requests and engine.launched is None
    for rid, ids in out.items():
        if rid != gone:
            assert reasons[rid] == "stop"
            jsonschema.validate(json.loads(parse_completion(ids).content), SCHEMA)
