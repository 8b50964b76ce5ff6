"""Structured outputs on the GPU path: a serving-size batch of schema-bound requests through the
engine with CUDA graphs and async scheduling, the Triton mask kernel, llguidance's fill running in
its worker while the step before's outputs are made, and the string bounds enforced beside the
grammar (structured/bounded.py). Random weights follow no format: every answer that validates, the
engine made so."""

from __future__ import annotations

import gc
import json

import jsonschema
import pytest
import torch

from osserve.engine.core.sampling_params import RETURN_TOKEN, SamplingParams
from osserve.engine.load import EngineArgs, build_engine
from osserve.harmony.render import ChatMessage, render_chat
from osserve.harmony.stream import parse_completion
from osserve.structured.grammar import bounded_answer, check
from osserve.structured.spec import StructuredOutputs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# A bounded integer and short strings: every answer fits the budget after the reasoning's half.
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["answer", "unit", "steps"],
          "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 999},
                         "unit": {"enum": ["km", "mi"]},
                         "steps": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3}}}
REQUESTS = 192
MAX_TOKENS = 256


@pytest.mark.parametrize("preset", ["tiny", "20b"])
def test_schema_bound_batch_validates_on_the_gpu_path(preset: str) -> None:
    gc.collect()  # the other preset's engine, before this one plans its memory
    torch.cuda.empty_cache()
    engine = build_engine(EngineArgs(load_format="dummy", preset=preset, max_model_len=2048, max_num_seqs=256,
                                     gpu_memory_utilization=0.85))
    spec = StructuredOutputs(json_schema=SCHEMA, harmony=True)
    check(spec, MAX_TOKENS)
    assert bounded_answer(spec, MAX_TOKENS) is not None  # the maxLength bounds are enforced beside the grammar
    in_flight = engine.profile.steps_in_flight
    outs: dict[str, list[int]] = {}
    reasons: dict[str, str | None] = {}
    for i in range(REQUESTS):
        ids = render_chat([ChatMessage("user", f"Question {i}: how far, in km?")], reasoning_effort="low").token_ids
        engine.add_request(f"r{i}", ids, SamplingParams(temperature=1.0, seed=i, max_tokens=MAX_TOKENS,
                                                        structured=spec))
        outs[f"r{i}"] = []
    while engine.has_unfinished():
        for d in engine.step():
            outs[d.request_id].extend(d.new_token_ids)
            if d.finished:
                reasons[d.request_id] = d.finish_reason
    assert engine.profile.steps_in_flight > in_flight  # async scheduling carried the constrained steps
    assert engine.profile.grammar > 0
    stopped = [rid for rid, reason in reasons.items() if reason == "stop"]
    assert len(reasons) == REQUESTS and len(stopped) >= 0.9 * REQUESTS, reasons
    for rid in stopped:
        ids = outs[rid]
        assert ids[-1] == RETURN_TOKEN
        answer = json.loads(parse_completion(ids).content)
        jsonschema.validate(answer, SCHEMA)  # maxLength included
    assert len({tuple(outs[rid]) for rid in stopped}) > REQUESTS // 2  # the seeds drew different outputs
