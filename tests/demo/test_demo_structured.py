"""Structured outputs on the built-in demo model: the reasoning stays the model's own, the answer
follows the schema, and the OpenAI Agents SDK gets its Pydantic output type back."""

from __future__ import annotations

import json
from collections.abc import Iterator

import jsonschema
import pytest
from openai import AsyncOpenAI, OpenAI
from pydantic import BaseModel

from osserve.demo.compact import expand_compact
from osserve.demo.weights import DEMO_WEIGHTS
from osserve.engine.async_engine import AsyncEngine
from osserve.engine.load import EngineArgs, build_engine
from osserve.server.app import ServerConfig, create_app
from tests.server.serving import serve

MODEL = "osserve-demo"


class Sum(BaseModel):
    total: int
    explanation: str


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    model_dir = expand_compact(DEMO_WEIGHTS, tmp_path_factory.mktemp("demo"))
    engine = AsyncEngine(build_engine(EngineArgs(model=str(model_dir), device="cpu", max_model_len=1024)))
    try:
        with serve(create_app(engine, engine.tokenizer, ServerConfig(model_name=MODEL))) as url:
            yield url
    finally:
        engine.shutdown()


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
