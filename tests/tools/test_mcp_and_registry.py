"""MCP servers through the official SDK, and the `--tool-server` registry: a real MCP server (the
SDK's MCPServer, over streamable HTTP and over SSE) runs inside the test on 127.0.0.1 with tools
that add, raise and hang; the registry builds `demo` plus that server and routes harmony
recipients to each tool."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from osserve.errors import ToolSetupError
from osserve.tools.mcp_client import connect_mcp_server, harmony_schema
from osserve.tools.python.sandbox import SandboxLimits
from osserve.tools.registry import ToolServerOptions, ToolServers, parse_tool_servers
from tests.tools.mcp_servers import free_port, running_mcp_server


@pytest.fixture(scope="module")
def mcp_urls() -> Iterator[dict[str, str]]:
    """The same MCP server over streamable HTTP and over SSE, each on a port of its own."""
    with running_mcp_server() as urls:
        yield urls


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout=60))


@pytest.mark.parametrize("kind", ["http", "sse"])
def test_lists_and_calls_tools(mcp_urls: dict[str, str], kind: str) -> None:
    async def go() -> list[Any]:
        server = await connect_mcp_server(mcp_urls[kind])
        return [server, await server.call("add", {"a": 2, "b": 3}), await server.call("fail", {"reason": "x"}),
                await server.call("add", {"a": "two"}), await server.call("nope", {}),
                await server.call("hang", {}, timeout=0.5)]

    server, added, failed, invalid, unknown, hung = run(go())
    assert server.label == "calc_server" and server.instructions == "Arithmetic on integers."
    assert sorted(server.tools) == ["add", "fail", "hang", "square"]
    assert added.text == "5" and not added.is_error
    assert failed.is_error and "fail" in failed.text
    assert invalid.is_error and "validation error" in invalid.text
    assert unknown.is_error and "has no tool `nope`" in unknown.text
    assert hung.is_error and "timed out after 0.5 seconds" in hung.text


def test_a_bare_host_and_port_finds_the_sse_server(mcp_urls: dict[str, str]) -> None:
    address = mcp_urls["sse"].removeprefix("http://").removesuffix("/sse")
    server = run(connect_mcp_server(address))
    assert server.url == mcp_urls["sse"] and server.label == "calc_server"


def test_an_unreachable_server_is_a_start_error_naming_it() -> None:
    address = f"http://127.0.0.1:{free_port()}/mcp"
    with pytest.raises(ToolSetupError, match=f"MCP server {address} is unreachable"):
        run(connect_mcp_server(address, connect_timeout=5))


def test_schemas_lose_titles_but_keep_a_property_named_title() -> None:
    schema = {"title": "args", "type": "object", "properties": {
        "title": {"title": "Title", "type": "string"},
        "n": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None}}}
    assert harmony_schema(schema) == {"type": "object", "properties": {
        "title": {"type": "string"}, "n": {"type": ["integer", "null"], "default": None}}}


@pytest.mark.parametrize(("spec", "message"), [
    ("", "--tool-server is empty"), ("demo,web", "unknown tool server `web`"),
    ("ftp://x/mcp", "unknown tool server `ftp://x/mcp`")])
def test_bad_tool_server_lists(spec: str, message: str) -> None:
    with pytest.raises(ToolSetupError, match=message):
        parse_tool_servers(spec)


def test_registry_routes_recipients_to_every_tool(mcp_urls: dict[str, str]) -> None:
    options = ToolServerOptions(python_limits=SandboxLimits(wall_seconds=5), mcp_call_timeout=5)

    async def go() -> tuple[Any, list[Any]]:
        servers = await ToolServers.start(f"demo,{mcp_urls['http']}", options)
        conversation = servers.open_conversation()
        try:
            results = [await conversation.call(recipient, text) for recipient, text in (
                ("calc_server.add", '{"a": 20, "b": 22}'), ("calc_server.fail", '{"reason": "r"}'),
                ("calc_server.add", "{not json"), ("calc_server.add", "[1]"),
                ("browser.search", '{"query": "MXFP4 scale byte"}'), ("browser.open", '{"id": 0}'),
                ("python", "x = 40"), ("python", "x + 2"), ("functions.get_weather", "{}"),
                ("calc_server", "{}"), ("browser.nope", "{}"))]
            return servers.namespaces(), results
        finally:
            await conversation.close()
            await servers.close()

    namespaces, results = run(go())
    assert sorted(namespaces) == ["browser", "calc_server", "python"]
    assert [t.name for t in namespaces["calc_server"].tools] == ["add", "square", "fail", "hang"]
    added, failed, bad_json, not_object, search, opened, assign, value, function, bare, unknown = results
    assert (added.text, added.is_error) == ("42", False)
    assert failed.is_error
    assert bad_json.is_error and "Invalid JSON arguments" in bad_json.text
    assert not_object.is_error and "must be a JSON object" in not_object.text
    assert not search.is_error and "【0†MXFP4 weights†docs.osserve.invalid】" in search.text
    assert opened.text.startswith("[1] MXFP4 weights")
    assert assign.text.startswith("[WARN]") and value.text == "42\n"
    assert function.is_error and bare.is_error and "No tool" in function.text
    assert unknown.is_error and "Unknown function: nope" in unknown.text


def test_registry_namespaces_render_in_harmony(mcp_urls: dict[str, str]) -> None:
    from openai_harmony import (
        Conversation,
        HarmonyEncodingName,
        Message,
        Role,
        SystemContent,
        load_harmony_encoding,
    )

    from osserve.tokenizer import load_tokenizer

    load_tokenizer()  # points openai-harmony at the offline vocabulary
    encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)

    async def go() -> dict[str, Any]:
        servers = await ToolServers.start(f"browser,{mcp_urls['sse']}")
        try:
            return servers.namespaces()
        finally:
            await servers.close()

    namespaces = run(go())
    system = SystemContent.new()
    for namespace in namespaces.values():
        system = system.with_tools(namespace)
    conversation = Conversation.from_messages([Message.from_role_and_content(Role.SYSTEM, system)])
    text = encoding.decode(encoding.render_conversation(conversation))
    assert "namespace browser {" in text and "namespace calc_server {" in text
    assert "// Arithmetic on integers." in text and "type add = (_: {" in text
    assert "note?: string | null" in text and "// A\n" not in text  # typed, and no title comments


def test_the_browser_can_serve_an_operators_folder(tmp_path: Path) -> None:
    (tmp_path / "notes.md").write_text("# Release notes\n\nThe zebra release ships on Tuesday.")

    async def go() -> str:
        servers = await ToolServers.start("browser", ToolServerOptions(browser_documents=tmp_path))
        try:
            return (await servers.open_conversation().call("browser.search", '{"query": "zebra"}')).text
        finally:
            await servers.close()

    assert "【0†Release notes†docs.osserve.invalid】" in run(go())
    with pytest.raises(ToolSetupError, match="the browser cannot start"):
        run(ToolServers.start("browser", ToolServerOptions(browser_documents=tmp_path / "missing")))


def test_an_unreachable_server_fails_the_registry_start() -> None:
    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(ToolSetupError, match=f"MCP server {address} is unreachable"):
        run(ToolServers.start(f"browser,{address}", ToolServerOptions(mcp_connect_timeout=5)))


def test_a_label_taken_by_a_builtin_is_refused(mcp_urls: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    from osserve.tools import mcp_client

    real = mcp_client.list_server

    async def named_python(url: str, timeout: float) -> Any:
        _, instructions, tools = await real(url, timeout)
        return "python", instructions, tools

    monkeypatch.setattr(mcp_client, "list_server", named_python)
    with pytest.raises(ToolSetupError, match="reports the name `python`"):
        run(ToolServers.start(f"browser,{mcp_urls['http']}"))


@pytest.mark.parametrize(("allowed", "asked", "ok"), [
    ("http://mcp.example.com/mcp", "http://mcp.example.com/mcp", True),
    ("http://mcp.example.com/mcp", "HTTP://MCP.Example.com/mcp/", True),  # scheme and host case, a trailing slash
    ("http://mcp.example.com/mcp", "http://mcp.example.com:80/mcp", False),  # a port is a port
    ("http://mcp.example.com/mcp", "http://mcp.example.com/mcp/../admin", False),
    ("http://mcp.example.com/mcp", "http://mcp.example.com.evil.net/mcp", False),
    ("http://mcp.example.com/mcp", "http://user@mcp.example.com/mcp", False),  # credentials: only itself matches
    ("http://mcp.example.com/mcp", "http://mcp.example.com/MCP", False),  # paths are case-sensitive
    ("http://mcp.example.com/mcp", "https://mcp.example.com/mcp", False),
    ("http://mcp.example.com/mcp", "file:///etc/passwd", False),
])
def test_the_url_allow_list_matches_exactly(allowed: str, asked: str, ok: bool) -> None:
    servers = ToolServers(None, None, [], ToolServerOptions(allowed_server_urls=(allowed,)))
    assert servers.allows(asked) is ok


def test_a_request_named_url_is_listed_once_and_a_started_one_is_allowed(mcp_urls: dict[str, str]) -> None:
    async def go() -> tuple[Any, ...]:
        servers = await ToolServers.start(mcp_urls["http"], ToolServerOptions(allowed_server_urls=(mcp_urls["sse"],)))
        try:
            named = await servers.url_server(mcp_urls["sse"] + "/")
            again = await servers.url_server(mcp_urls["sse"])
            started = await servers.url_server(mcp_urls["http"])
            return named, again, started, servers.mcp["calc_server"]
        finally:
            await servers.close()

    named, again, started, configured = run(go())
    assert named is again and named.url == mcp_urls["sse"] + "/" and "square" in named.tools
    assert started is configured  # a --tool-server URL is allowed, and is that server
    relabeled = named.relabeled("mine")
    assert relabeled.label == "mine" and relabeled.namespace_config().name == "mine"


def test_an_unreachable_allowed_url_is_an_error_naming_it() -> None:
    url = f"http://127.0.0.1:{free_port()}/mcp"

    async def go() -> None:
        servers = await ToolServers.start(None, ToolServerOptions(allowed_server_urls=(url,), mcp_connect_timeout=5))
        try:
            await servers.url_server(url)
        finally:
            await servers.close()

    with pytest.raises(ToolSetupError, match=f"MCP server {url} is unreachable"):
        run(go())
