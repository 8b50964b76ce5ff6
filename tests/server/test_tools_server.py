"""The server's tools on the tiny random-weight checkpoint: the model follows nothing by itself, so
each call here is forced (`tool_choice`), its arguments held to the tool's schema by the output
grammar, and run for real: an MCP server (the SDK's, on 127.0.0.1) behind `--tool-server`, the
sandboxed python and the offline browser of `demo`. And `osserve serve` refuses to start with an
unreachable MCP server, naming it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from osserve import cli
from osserve.engine.async_engine import AsyncEngine
from osserve.engine.load import EngineArgs, build_engine
from osserve.server.app import ServerConfig, create_app
from osserve.tools.python.sandbox import SandboxLimits
from osserve.tools.registry import ToolServerOptions
from tests.server.openai_spec import Contract
from tests.server.serving import serve
from tests.server.test_contract import live_api_schemas, stream
from tests.tools.mcp_servers import free_port, running_mcp_server

MODEL = "tiny"
CALC = {"type": "mcp", "server_label": "calc_server", "require_approval": "never"}


@pytest.fixture(scope="module")
def spec() -> Contract:
    return Contract(live_api_schemas())


@pytest.fixture(scope="module")
def base(tiny_checkpoint: Path) -> Iterator[str]:
    eng = AsyncEngine(build_engine(EngineArgs(model=str(tiny_checkpoint), device="cpu", max_model_len=2048)))
    try:
        with running_mcp_server() as urls:
            options = ToolServerOptions(python_limits=SandboxLimits(wall_seconds=10), mcp_call_timeout=10)
            config = ServerConfig(model_name=MODEL, tool_servers=f"demo,{urls['http']}", tool_options=options)
            with serve(create_app(eng, eng.tokenizer, config)) as url:
                yield url
    finally:
        eng.shutdown()


def respond(base: str, **request: Any) -> dict[str, Any]:
    r = httpx.post(base + "/v1/responses", json={"model": MODEL, "input": "Go.", "temperature": 0,
                                                  "max_tool_calls": 1, **request}, timeout=300)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def first_of(body: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(item for item in body["output"] if item["type"] == kind)


def test_a_forced_mcp_call_reaches_the_server(base: str, spec: Contract) -> None:
    body = respond(base, tools=[CALC], max_output_tokens=64,
                   tool_choice={"type": "mcp", "server_label": "calc_server", "name": "square"})
    spec.check("Response", body)
    assert body["output"][0]["type"] == "mcp_list_tools"
    call = first_of(body, "mcp_call")
    n = json.loads(call["arguments"])["n"]  # whatever the model picked, valid for the schema
    assert call["status"] == "completed" and call["output"] == str(n * n) and call["error"] is None


def test_a_forced_mcp_call_streams_its_events_in_order(base: str, spec: Contract) -> None:
    request = {"model": MODEL, "input": "Go.", "temperature": 0, "max_output_tokens": 64, "max_tool_calls": 1,
               "tools": [CALC], "tool_choice": {"type": "mcp", "server_label": "calc_server", "name": "fail"}}
    events = [e for _, e in stream(base, "/v1/responses", request)]
    for event in events:
        spec.check_event(event)
    names = [e["type"] for e in events]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    start = names.index("response.mcp_call.in_progress")
    end = names.index("response.mcp_call.failed")  # the tool raises: the response goes on
    assert names[start - 1] == "response.output_item.added" and names[end + 1] == "response.output_item.done"
    assert set(names[start + 1:end - 1]) == {"response.mcp_call_arguments.delta"}
    assert names[end - 1] == "response.mcp_call_arguments.done"
    failed = events[end + 1]["item"]
    assert failed["status"] == "failed" and failed["error"]["type"] == "mcp_tool_execution_error"
    assert names[-1] in ("response.completed", "response.incomplete")


def test_forced_python_runs_in_the_sandbox(base: str, spec: Contract) -> None:
    body = respond(base, tools=[{"type": "code_interpreter", "container": {"type": "auto"}}], max_output_tokens=64,
                   tool_choice={"type": "code_interpreter"})
    spec.check("Response", body)
    call = first_of(body, "code_interpreter_call")
    (logs,) = call["outputs"]
    # Random weights write no Python: the sandbox says so, and the model is shown the same.
    assert call["status"] == "completed" and call["code"] and logs["type"] == "logs" and logs["logs"]


def test_a_forced_web_search_searches_the_offline_documents(base: str, spec: Contract) -> None:
    body = respond(base, tools=[{"type": "web_search_preview"}], max_output_tokens=200,
                   tool_choice={"type": "web_search_preview"})
    spec.check("Response", body)
    call = first_of(body, "web_search_call")
    assert call["status"] == "completed" and call["action"]["type"] == "search" and call["action"]["query"]


def test_an_unreachable_mcp_server_stops_the_start(tiny_checkpoint: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}/mcp"
    assert cli.main(["serve", str(tiny_checkpoint), "--device", "cpu", "--tool-server", f"browser,{url}"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"osserve: error: MCP server {url} is unreachable") and err.count("\n") == 1
