"""Structured outputs on the built-in demo model: the reasoning stays the model's own, the answer
follows the schema, and the OpenAI Agents SDK gets its Pydantic output type back."""

from __future__ import annotations

import json

import jsonschema
from openai import AsyncOpenAI, OpenAI
from pydantic import BaseModel

from tests.demo.demo_server import MODEL


class Sum(BaseModel):
    total: int
    explanation: str


def test_json_schema_keeps_the_reasoning_and_shapes_the_answer(base: str) -> None:
    client = OpenAI(base_url=base + "/v1", api_key="x", timeout=300)
    ask = {"model": MODEL, "messages": [{"role": "user", "content": "What is 37 + 45?"}], "temperature": 0,
           "max_tokens": 400, "reasoning_effort": "low"}
    free = client.chat.completions.create(**ask).choices[0].message
    schema = Sum.model_json_schema() | {"additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "sum", "schema": schema, "strict": True}}
    shaped = client.chat.completions.create(**ask, response_format=fmt).choices[0]  # type: ignore[arg-type]
    assert "82" in (free.content or "")
    # The reasoning is unconstrained: greedy, it reads word for word as without the format.
    assert shaped.message.reasoning == free.reasoning and "82" in (free.reasoning or "")  # type: ignore[attr-defined]
    assert shaped.finish_reason == "stop"
    jsonschema.validate(json.loads(shaped.message.content or ""), schema)


def test_agents_sdk_with_a_pydantic_output_type(base: str) -> None:
    import agents

    agents.set_tracing_disabled(True)  # it would send traces to OpenAI
    model = agents.OpenAIResponsesModel(model=MODEL, openai_client=AsyncOpenAI(base_url=base + "/v1", api_key="x"))
    agent = agents.Agent(name="calc", instructions="Answer the sum.", model=model, output_type=Sum,
                         model_settings=agents.ModelSettings(temperature=0, max_tokens=400))
    result = agents.Runner.run_sync(agent, "What is 37 + 45?")
    assert isinstance(result.final_output, Sum)
