"""The built-in demo model with the server's tools (`--tool-server demo` and an MCP server): the
showcase's python round trip through /v1/responses, and the OpenAI Agents SDK's hosted tools
(`CodeInterpreterTool`, `HostedMCPTool`) on an `OpenAIResponsesModel`.

The shipped weights never learned the python tool (corpus 1): each call here is forced, and the
tests assert what the server guarantees (the call made, run in the sandbox or on the MCP server,
its output shown to the model and returned as OpenAI's item), not that the model's code is right.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from osserve.demo.showcase import ShowcaseResult, python_round_trip, why_forced
from osserve.server.app import ServerConfig
from osserve.tools.python.sandbox import SandboxLimits
from osserve.tools.registry import ToolServerOptions
from tests.demo.demo_server import MODEL, serving_demo
from tests.tools.mcp_servers import running_mcp_server


@pytest.fixture(scope="module")
def base(demo_model_dir: Path) -> Iterator[str]:
    """The demo model with `--tool-server demo,MCP_URL` (this module's own, not conftest's plain one)."""
    with running_mcp_server() as urls:
        options = ToolServerOptions(python_limits=SandboxLimits(wall_seconds=10), mcp_call_timeout=10)
        config = ServerConfig(model_name=MODEL, tool_servers=f"demo,{urls['http']}", tool_options=options)
        with serving_demo(demo_model_dir, config) as url:
            yield url


def test_showcase_python_round_trip(base: str) -> None:
    lines: list[str] = []
    shown = ShowcaseResult()
    python_round_trip(base, MODEL, {}, shown, lines.append)  # the showcase's third part (the others: test_demo_server)
    call = shown.python
    assert call["type"] == "code_interpreter_call" and call["status"] == "completed" and call["code"]
    assert call["outputs"][0]["type"] == "logs" and call["outputs"][0]["logs"]  # what the sandbox said, shown
    assert any(line.startswith("python:    ") for line in lines) and any(line.startswith("output:") for line in lines)


def test_the_showcase_says_why_the_shipped_weights_need_forcing() -> None:
    from osserve.demo.weights import BUILTIN_NAME

    # corpus 1 (test_corpus_and_training): the built-in model's line says its python is not to be believed
    assert why_forced(BUILTIN_NAME) == ": the shipped demo weights predate the python tool"
    assert why_forced("openai/gpt-oss-20b") == why_forced(MODEL) == ""


def agents_run(base: str, tools: list[Any], tool_choice: Any) -> Any:
    import agents

    agents.set_tracing_disabled(True)  # it would send traces to OpenAI
    model = agents.OpenAIResponsesModel(model=MODEL, openai_client=AsyncOpenAI(base_url=base + "/v1", api_key="x"))
    settings = agents.ModelSettings(tool_choice=tool_choice, temperature=0, max_tokens=300)
    agent = agents.Agent(name="calc", instructions="Answer the question.", model=model, tools=tools,
                         model_settings=settings)
    return asyncio.run(agents.Runner.run(agent, "What is 123 * 456?", max_turns=2))


def raw_items(result: Any, kind: str) -> list[Any]:
    return [r for r in (response.output for response in result.raw_responses) for r in r if r.type == kind]


def test_agents_sdk_code_interpreter(base: str) -> None:
    import agents

    tool = agents.CodeInterpreterTool(tool_config={"type": "code_interpreter", "container": {"type": "auto"}})
    result = agents_run(base, [tool], "code_interpreter")
    (call,) = raw_items(result, "code_interpreter_call")
    assert call.status == "completed" and call.code and call.outputs and call.outputs[0].logs
    assert any(isinstance(item, agents.ToolCallItem) for item in result.new_items)
    assert isinstance(result.final_output, str)


def test_agents_sdk_hosted_mcp(base: str) -> None:
    import agents
    from agents.model_settings import MCPToolChoice

    tool = agents.HostedMCPTool(tool_config={"type": "mcp", "server_label": "calc_server", "require_approval": "never",
                                             "allowed_tools": ["square"]})
    result = agents_run(base, [tool], MCPToolChoice(server_label="calc_server", name="square"))
    (listed,) = raw_items(result, "mcp_list_tools")
    assert [t.name for t in listed.tools] == ["square"]
    (call,) = raw_items(result, "mcp_call")
    n = json.loads(call.arguments)["n"]
    assert call.name == "square" and call.output == str(n * n) and call.error is None
