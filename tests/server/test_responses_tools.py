"""The Responses API's tool loop over a scripted engine (no model): the model's steps are replayed
token for token, and the server runs the real tools: the sandboxed python, the offline browser
and a real MCP server (the SDK's, on 127.0.0.1) behind `--tool-server`. Every body and event is
checked against OpenAI's published schemas, and the prompts the engine was given show what the
model read."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from osserve.server.app import ServerConfig, create_app
from osserve.tokenizer import load_tokenizer
from osserve.tools.python.sandbox import SandboxLimits
from osserve.tools.registry import ToolServerOptions
from tests.server.openai_spec import Contract
from tests.server.serving import serve
from tests.server.stub_engine import ScriptedEngine
from tests.server.test_contract import live_api_schemas, stream
from tests.tools.mcp_servers import ConnectionCounter, running_mcp_server

MODEL = "stub"
RESPONSES = "/v1/responses"
THINK = "<|channel|>analysis<|message|>{}<|end|><|start|>assistant"
PY_CALL = "<|channel|>analysis to=python code<|message|>{}<|call|>"
SEARCH_CALL = '<|channel|>analysis to=browser.search code<|message|>{{"query": "{}"}}<|call|>'
OPEN_CALL = '<|channel|>analysis to=browser.open code<|message|>{{"id": {}}}<|call|>'
MCP_CALL = "<|channel|>commentary to=calc_server.{} <|constrain|>json<|message|>{}<|call|>"
FINAL = "<|channel|>final<|message|>{}<|return|>"
CODE = {"type": "code_interpreter", "container": {"type": "auto"}}
SEARCH = {"type": "web_search_preview"}
CALC = {"type": "mcp", "server_label": "calc_server", "require_approval": "never"}


def toks(text: str) -> list[int]:
    return load_tokenizer().encoding.encode(text, allowed_special="all")  # type: ignore[attr-defined]


def text(ids: list[int]) -> str:
    return load_tokenizer().encoding.decode(ids)  # type: ignore[attr-defined,no-any-return]


@pytest.fixture(scope="module")
def spec() -> Contract:
    return Contract(live_api_schemas())


@pytest.fixture(scope="module")
def mcp_urls() -> Iterator[dict[str, str]]:
    with running_mcp_server() as urls:
        yield urls


@pytest.fixture(scope="module")
def allowed() -> Iterator[dict[str, str]]:
    """A second MCP server, which requests may name by URL (the operator allowed it)."""
    with running_mcp_server() as urls:
        yield urls


@pytest.fixture(scope="module")
def stub() -> ScriptedEngine:
    return ScriptedEngine(max_model_len=8192)


@pytest.fixture(scope="module")
def base(stub: ScriptedEngine, mcp_urls: dict[str, str], allowed: dict[str, str]) -> Iterator[str]:
    options = ToolServerOptions(python_limits=SandboxLimits(wall_seconds=10), mcp_call_timeout=5,
                                allowed_server_urls=(allowed["http"],))
    config = ServerConfig(model_name=MODEL, tool_servers=f"demo,{mcp_urls['http']}", tool_options=options)
    with serve(create_app(stub, load_tokenizer(), config)) as url:
        yield url


def respond(base: str, stub: ScriptedEngine, steps: list[str], **request: Any) -> dict[str, Any]:
    stub.prompts.clear()
    stub.params.clear()
    stub.queue = [toks(s) for s in steps]
    r = httpx.post(base + RESPONSES, json={"model": MODEL, "input": "What is 123 * 456?", **request}, timeout=60)
    assert r.status_code == 200, r.text
    assert not stub.queue, "the response ended before the model's scripted steps did"
    body: dict[str, Any] = r.json()
    return body


def kinds(body: dict[str, Any]) -> list[str]:
    return [item["type"] for item in body["output"]]


def test_python_round_trip(base: str, stub: ScriptedEngine, spec: Contract) -> None:
    body = respond(base, stub, [THINK.format("Use python.") + PY_CALL.format("print(123 * 456)"),
                                THINK.format("It printed 56088.") + FINAL.format("123 * 456 = 56088.")],
                   tools=[CODE])
    spec.check("Response", body)
    assert body["status"] == "completed" and kinds(body) == ["reasoning", "code_interpreter_call", "reasoning",
                                                              "message"]
    call = body["output"][1]
    assert call["code"] == "print(123 * 456)" and call["outputs"] == [{"type": "logs", "logs": "56088\n"}]
    assert call["status"] == "completed" and call["container_id"].startswith("cntr_")
    assert body["output"][3]["content"][0]["text"] == "123 * 456 = 56088."
    first, second = stub.prompts
    # The second step reads the first's prompt and output as they were, then the tool's harmony message.
    assert second[:len(first)] == first
    assert text(second[len(first):]).endswith("print(123 * 456)<|call|><|start|>python to=assistant<|channel|>"
                                              "analysis<|message|>56088\n<|end|><|start|>assistant")
    assert "## python" in text(first) and "namespace browser" not in text(first)  # only declared tools are shown
    assert body["usage"]["input_tokens"] == len(first) + len(second)


def test_python_round_trip_streamed_events_in_order(base: str, stub: ScriptedEngine, spec: Contract) -> None:
    stub.queue = [toks(PY_CALL.format("print(2 ** 10)")), toks(FINAL.format("1024"))]
    events = [e for _, e in stream(base, RESPONSES, {"model": MODEL, "input": "2**10?", "tools": [CODE]})]
    for event in events:
        spec.check_event(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    names = [e["type"] for e in events]
    call = names.index("response.code_interpreter_call.in_progress")
    shown = [n for i, n in enumerate(names) if not (n.endswith(".delta") and names[i - 1] == n)]  # one delta each
    call = shown.index("response.code_interpreter_call.in_progress")
    assert shown[call - 1:call + 7] == [
        "response.output_item.added", "response.code_interpreter_call.in_progress",
        "response.code_interpreter_call_code.delta", "response.code_interpreter_call_code.done",
        "response.code_interpreter_call.interpreting", "response.code_interpreter_call.completed",
        "response.output_item.done", "response.output_item.added"]
    done = next(e["item"] for e in events if e["type"] == "response.output_item.done")
    assert done["outputs"] == [{"type": "logs", "logs": "1024\n"}] and done["code"] == "print(2 ** 10)"
    assert names[-1] == "response.completed" and events[-1]["response"]["output"][0] == done


def test_browser_search_open_and_a_cited_answer(base: str, stub: ScriptedEngine, spec: Contract) -> None:
    answer = "MXFP4 keeps one scale byte per block of 32 values 【1†L4-L6】."
    body = respond(base, stub, [SEARCH_CALL.format("MXFP4 scale byte"), OPEN_CALL.format(0), FINAL.format(answer)],
                   tools=[SEARCH])
    spec.check("Response", body)
    assert kinds(body) == ["web_search_call", "web_search_call", "message"]
    searched, opened, message = body["output"]
    assert searched["action"] == {"type": "search", "query": "MXFP4 scale byte", "queries": ["MXFP4 scale byte"]}
    assert opened["action"]["type"] == "open_page" and opened["action"]["url"].startswith("https://docs.osserve")
    (citation,) = message["content"][0]["annotations"]
    assert citation["type"] == "url_citation" and citation["url"] == opened["action"]["url"]
    assert answer[citation["start_index"]:citation["end_index"]] == "【1†L4-L6】"
    assert "【0†MXFP4 weights†docs.osserve.invalid】" in text(stub.prompts[1])  # the search results page


def test_mcp_calls_an_error_and_list_tools_streamed(base: str, stub: ScriptedEngine, spec: Contract) -> None:
    stub.prompts.clear()
    stub.queue = [toks(MCP_CALL.format("add", '{"a": 2, "b": 3}')), toks(MCP_CALL.format("fail", '{"reason": "x"}')),
                  toks(FINAL.format("5"))]
    events = [e for _, e in stream(base, RESPONSES, {"model": MODEL, "input": "2+3?", "tools": [CALC]})]
    for event in events:
        spec.check_event(event)
    names = [e["type"] for e in events]
    assert names[2:6] == ["response.output_item.added", "response.mcp_list_tools.in_progress",
                          "response.mcp_list_tools.completed", "response.output_item.done"]
    assert [t["name"] for t in events[5]["item"]["tools"]] == ["add", "square", "fail", "hang"]
    mcp_events = [n for i, n in enumerate(names) if n.startswith("response.mcp_call") and names[i - 1] != n]
    assert mcp_events == ["response.mcp_call.in_progress", "response.mcp_call_arguments.delta",
                          "response.mcp_call_arguments.done", "response.mcp_call.completed",
                          "response.mcp_call.in_progress", "response.mcp_call_arguments.delta",
                          "response.mcp_call_arguments.done", "response.mcp_call.failed"]
    final = events[-1]["response"]
    assert final["status"] == "completed" and kinds(final) == ["mcp_list_tools", "mcp_call", "mcp_call", "message"]
    added, failed = final["output"][1:3]
    assert (added["server_label"], added["name"], added["output"], added["status"]) == ("calc_server", "add", "5",
                                                                                       "completed")
    assert failed["status"] == "failed" and failed["output"] is None
    assert failed["error"]["content"][0]["text"] == "Error executing tool fail"  # the MCP server's words
    # The model read the error and went on.
    assert "Error executing tool fail" in text(stub.prompts[2]) and "namespace calc_server" in text(stub.prompts[0])


def test_a_request_named_server_url_needs_the_operators_leave(base: str, stub: ScriptedEngine,
                                                              allowed: dict[str, str]) -> None:
    stub.queue = [toks("<|channel|>commentary to=mine.add <|constrain|>json<|message|>{\"a\": 1, \"b\": 1}<|call|>"),
                  toks(FINAL.format("2"))]
    tool = {"type": "mcp", "server_label": "mine", "server_url": allowed["http"] + "/", "allowed_tools": ["add"]}
    r = httpx.post(base + RESPONSES, json={"model": MODEL, "input": "1+1?", "tools": [tool]}, timeout=60)
    assert r.status_code == 200, r.text
    listed, call, _ = r.json()["output"]
    assert listed["server_label"] == "mine" and [t["name"] for t in listed["tools"]] == ["add"]
    assert (call["server_label"], call["output"]) == ("mine", "2")
    hostile = ConnectionCounter()
    try:
        for url in (f"http://127.0.0.1:{hostile.port}/mcp", f"http://localhost:{hostile.port}/mcp",
                    f"http://user@127.0.0.1:{hostile.port}/mcp", "file:///etc/passwd"):
            tool = {"type": "mcp", "server_label": "evil", "server_url": url}
            r = httpx.post(base + RESPONSES, json={"model": MODEL, "input": "hi", "tools": [tool]}, timeout=30)
            assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0].server_url", r.text
        assert hostile.accepted == 0
    finally:
        hostile.close()


@pytest.mark.parametrize(("tool", "choice", "param", "message"), [
    ({"type": "mcp", "server_label": "nowhere"}, None, "tools[0].server_label", "no MCP server labelled 'nowhere'"),
    ({**CALC, "require_approval": "always"}, None, "tools[0].require_approval", "approvals are not supported"),
    ({**CALC, "allowed_tools": ["add", "mul"]}, None, "tools[0].allowed_tools", "names mul"),
    ({**CALC, "server_label": "python"}, None, "tools[0].server_label", "not one of"),
    ({**CALC, "headers": {"Authorization": "x"}}, None, "tools[0].headers", "without a client's credentials"),
    ({"type": "code_interpreter", "container": "cntr_abc"}, None, "tools[0].container", "only {\"type\": \"auto\"}"),
    ({"type": "file_search", "vector_store_ids": ["v"]}, None, "tools[0].type", "not supported"),
    (SEARCH, {"type": "code_interpreter"}, "tool_choice", "not in tools"),
    (CODE, {"type": "mcp", "server_label": "calc_server"}, "tool_choice", "not in tools"),
    (CODE, {"type": "code_interpreter"}, "max_tool_calls", "max_tool_calls is 0"),
])
def test_tools_the_server_cannot_give_are_400s(base: str, tool: dict[str, Any], choice: Any, param: str,
                                               message: str) -> None:
    request: dict[str, Any] = {"model": MODEL, "input": "hi", "tools": [tool]}
    if choice is not None:
        request["tool_choice"] = choice
    if param == "max_tool_calls":
        request["max_tool_calls"] = 0
    r = httpx.post(base + RESPONSES, json=request, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and message in error["message"], error


@pytest.mark.parametrize(("field", "value", "param"), [
    ("input", [{"type": "code_interpreter_call", "id": "ci_1", "code": "print(1)", "outputs": 5}], "input[0].outputs"),
    ("input", [{"type": "code_interpreter_call", "id": {"x": 1}, "code": "print(1)"}], "input[0].id"),
    ("input", [{"type": "mcp_call", "server_label": "calc_server", "name": "add", "arguments": {"a": 1}}],
     "input[0].arguments"),
    ("input", [{"type": "mcp_call", "server_label": "calc_server", "name": "add", "arguments": "{}",
                "output": {"sum": 2}}], "input[0].output"),
    ("input", [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": {"a": 1}}], "input[0].arguments"),
    ("tools", [{"type": "function", "name": "f", "parameters": "an object"}], "tools[0].parameters"),
    ("text", {"format": 5}, "text.format"),
])
def test_malformed_items_and_fields_are_400s_naming_them(base: str, field: str, value: Any, param: str) -> None:
    r = httpx.post(base + RESPONSES, json={"model": MODEL, "input": "hi", field: value}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_an_undeclared_tool_is_not_run_and_the_model_is_told(base: str, stub: ScriptedEngine) -> None:
    body = respond(base, stub, [PY_CALL.format("print('ran')"), FINAL.format("No python here.")])
    assert kinds(body) == ["message"] and body["status"] == "completed"
    assert text(stub.prompts[1]).endswith("print('ran')<|call|><|start|>python to=assistant<|channel|>analysis"
                                          "<|message|>No tool `python` is available here. Answer without it.<|end|>"
                                          "<|start|>assistant")


def test_forced_tool_binds_the_first_step_and_max_tool_calls_closes_the_rest(base: str, stub: ScriptedEngine) -> None:
    fn = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}
    respond(base, stub, [PY_CALL.format("print(1)"), PY_CALL.format("print(2)"), FINAL.format("done")],
            tools=[CODE, SEARCH, fn], tool_choice={"type": "code_interpreter"}, max_tool_calls=2)
    first, second, third = (p.structured for p in stub.params)
    assert first is not None and first.tool_choice == "required" and [t.recipient for t in first.tools] == ["python"]
    assert second is not None and second.tool_choice == "auto" and len(second.tools) == 5  # lookup's strict schema
    # Past max_tool_calls: only the function and the answer remain.
    assert third is not None and third.closed_tools and [t.name for t in third.tools] == ["lookup"]


def test_previous_response_keeps_the_python_session_and_the_items(base: str, stub: ScriptedEngine) -> None:
    first = respond(base, stub, [PY_CALL.format("x = 41"), FINAL.format("Stored.")], tools=[CODE])
    again = respond(base, stub, [PY_CALL.format("print(x + 1)"), FINAL.format("42")], tools=[CODE],
                    previous_response_id=first["id"], input="And x + 1?")
    assert again["output"][0]["outputs"] == [{"type": "logs", "logs": "42\n"}]
    assert again["output"][0]["container_id"] == first["output"][0]["container_id"]
    stored = httpx.get(f"{base}{RESPONSES}/{first['id']}").json()
    assert kinds(stored) == ["code_interpreter_call", "message"]
    # A client that keeps the history itself sends the tool items back as input.
    history = [{"role": "user", "content": "x?"}, *first["output"], {"role": "user", "content": "Again?"}]
    respond(base, stub, [FINAL.format("ok")], input=history)
    assert "<|start|>assistant to=python<|channel|>analysis code<|message|>x = 41<|call|>" not in text(stub.prompts[0])
    assert "Stored." in text(stub.prompts[0])  # the earlier turn's tool use is chain of thought: dropped after it


def test_tool_items_as_input_render_as_calls_and_results(base: str, stub: ScriptedEngine) -> None:
    items = [{"role": "user", "content": "2+3?"},
             {"type": "mcp_call", "id": "mcp_1", "server_label": "calc_server", "name": "add",
              "arguments": '{"a": 2, "b": 3}', "output": "5"},
             {"type": "code_interpreter_call", "id": "ci_1", "code": "print(5)", "container_id": "c",
              "outputs": [{"type": "logs", "logs": "5\n"}], "status": "completed"},
             {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search"}}]
    respond(base, stub, [FINAL.format("5")], input=items, tools=[CALC, CODE])
    prompt = text(stub.prompts[0])
    assert ('<|start|>assistant to=calc_server.add<|channel|>commentary <|constrain|>json<|message|>{"a": 2, "b": 3}'
            "<|call|><|start|>calc_server.add to=assistant<|channel|>commentary<|message|>5<|end|>") in prompt
    assert ("<|start|>assistant to=python<|channel|>analysis code<|message|>print(5)<|call|><|start|>python "
            "to=assistant<|channel|>analysis<|message|>5\n<|end|>") in prompt


def test_the_output_budget_spans_every_step(base: str, stub: ScriptedEngine) -> None:
    step = toks(PY_CALL.format("print(1)"))
    stub.params.clear()
    stub.queue = [step, toks(FINAL.format("one two three four five six seven"))]
    r = httpx.post(base + RESPONSES, json={"model": MODEL, "input": "hi", "tools": [CODE],
                                           "max_output_tokens": len(step) + 4}, timeout=60)
    body = r.json()
    assert body["status"] == "incomplete" and body["usage"]["output_tokens"] == len(step) + 4
    assert stub.params[1].max_tokens == 4 and body["output"][-1]["status"] == "incomplete"


def test_without_tool_servers_builtin_tools_are_400s(stub: ScriptedEngine) -> None:
    with serve(create_app(stub, load_tokenizer(), ServerConfig(model_name=MODEL))) as url:
        for tool, param in ((SEARCH, "tools[0]"), (CODE, "tools[0]"), (CALC, "tools[0].server_label"),
                            ({**CALC, "server_url": "http://127.0.0.1:9/mcp"}, "tools[0].server_url")):
            r = httpx.post(url + RESPONSES, json={"model": MODEL, "input": "hi", "tools": [tool]}, timeout=30)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        assert "--tool-server demo" in httpx.post(url + RESPONSES, json={
            "model": MODEL, "input": "hi", "tools": [CODE]}, timeout=30).json()["error"]["message"]


def test_json_of_a_tool_result_is_the_models_to_read(base: str, stub: ScriptedEngine) -> None:
    body = respond(base, stub, [MCP_CALL.format("add", "{not json"), FINAL.format("sorry")], tools=[CALC])
    call = body["output"][1]
    assert call["status"] == "failed" and "Invalid JSON arguments" in json.dumps(call["error"])
