"""MCP tool servers through the official `mcp` SDK (2.x): list a server's tools at start, call them.

An address is a URL: streamable HTTP (`http://host:port/mcp`), or SSE where the path ends in
`/sse`; a bare `host:port` tries streamable HTTP at `/mcp`, then SSE at `/sse` (vLLM's
`--tool-server host:port` means the latter). A server is known by the name it reports in its server
info (the `server_label`), made safe for a harmony recipient (letters, digits, `_` and `-`).

Each call opens its own connection (a few milliseconds on a local network) and closes it, so a
server that restarts between calls is no problem, and nothing is bound to one asyncio task. A call
never raises for what the server does: an error result, a timeout or a lost server come back as an
`McpCallResult` with `is_error`; only `connect_mcp_server` at start raises, naming the address.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
from openai_harmony import ToolDescription, ToolNamespaceConfig

from osserve.errors import ToolSetupError

LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


@dataclass(frozen=True)
class McpCallResult:
    text: str  # what the model is shown
    is_error: bool = False


@dataclass(frozen=True)
class McpTool:
    name: str
    description: str
    input_schema: dict[str, Any]


@asynccontextmanager
async def open_client(url: str) -> AsyncIterator[Any]:
    """A connected `mcp.Client` for `url` (SSE where the path ends in /sse)."""
    from mcp import Client
    from mcp.client.sse import sse_client

    server: Any = sse_client(url) if url.rstrip("/").endswith("/sse") else url
    async with Client(server) as client:
        yield client


def candidate_urls(address: str) -> list[str]:
    address = address.strip()
    if re.match(r"^https?://", address):
        return [address]
    base = "http://" + address.rstrip("/")
    return [base + "/mcp", base + "/sse"]


def root_cause(exc: BaseException) -> BaseException:
    """The first leaf of an exception group (anyio wraps transport errors in task groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def harmony_schema(schema: Any) -> Any:
    """A tool's JSON schema as harmony renders it well: no `title` keys (harmony prints them as
    comments), and `anyOf: [X, null]` as `type: [X, "null"]`."""
    if isinstance(schema, list):
        return [harmony_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            out[key] = {name: harmony_schema(sub) for name, sub in value.items()}
        else:
            out[key] = harmony_schema(value)
    options = out.get("anyOf")
    if isinstance(options, list) and all(isinstance(o, dict) and set(o) == {"type"} for o in options):
        types = [o["type"] for o in options]
        if all(isinstance(t, str) for t in types):
            del out["anyOf"]
            out["type"] = types
    return out


def result_text(result: Any) -> str:
    """The model's view of a CallToolResult: its text blocks, placeholders for the rest, the
    structured content when there is nothing else."""
    parts = []
    for block in result.content or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource":
            inner = block.resource
            parts.append(getattr(inner, "text", None) or f"[resource {inner.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource link {block.uri}]")
        else:
            parts.append(f"[{kind} content, {getattr(block, 'mime_type', 'unknown type')}]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


class McpServer:
    """One MCP server, as listed at start. Build it with `await connect_mcp_server(address)`."""

    def __init__(self, url: str, label: str, instructions: str, tools: list[McpTool],
                 call_timeout: float) -> None:
        self.url = url
        self.label = label
        self.instructions = instructions
        self.tools = {tool.name: tool for tool in tools}
        self.call_timeout = call_timeout

    def namespace_config(self, label: str | None = None, only: list[str] | None = None) -> ToolNamespaceConfig:
        """The harmony namespace that shows this server's tools (those named in `only`, when given),
        under `label` (the server's own by default)."""
        return ToolNamespaceConfig(
            name=label or self.label, description=self.instructions,
            tools=[ToolDescription.new(t.name, t.description, parameters=harmony_schema(t.input_schema))
                   for t in self.tools.values() if only is None or t.name in only])

    def relabeled(self, label: str) -> McpServer:
        """The same server and tools, known by another label (a request's `server_label`)."""
        return McpServer(self.url, label, self.instructions, list(self.tools.values()), self.call_timeout)

    async def call(self, name: str, arguments: dict[str, Any], timeout: float | None = None) -> McpCallResult:
        """Calls tool `name`; every failure comes back as an error result (see the module doc)."""
        if name not in self.tools:
            return McpCallResult(f"MCP server `{self.label}` has no tool `{name}`", is_error=True)
        limit = self.call_timeout if timeout is None else timeout
        try:
            with anyio.fail_after(limit):
                async with open_client(self.url) as client:
                    result = await client.call_tool(name, arguments, read_timeout_seconds=limit)
        except TimeoutError:
            return McpCallResult(f"MCP tool `{self.label}.{name}` timed out after {limit:g} seconds",
                                 is_error=True)
        except Exception as exc:  # the server, the transport or the SDK: all the model's business
            cause = root_cause(exc)
            if isinstance(cause, TimeoutError) or "timed out" in str(cause):
                return McpCallResult(f"MCP tool `{self.label}.{name}` timed out after {limit:g} seconds",
                                     is_error=True)
            return McpCallResult(f"MCP tool `{self.label}.{name}` failed: {cause}", is_error=True)
        return McpCallResult(result_text(result), is_error=bool(result.is_error))


async def list_server(url: str, timeout: float) -> tuple[str, str, list[McpTool]]:
    """(label, instructions, tools) of the server at `url`, every page of its tool list."""
    with anyio.fail_after(timeout):
        async with open_client(url) as client:
            info = client.server_info
            tools: list[McpTool] = []
            cursor: str | None = None
            for _ in range(100):
                page = await client.list_tools(cursor=cursor)
                tools += [McpTool(t.name, t.description or "", dict(t.input_schema or {})) for t in page.tools]
                cursor = page.next_cursor
                if not cursor:
                    break
            return (info.name if info is not None else ""), client.instructions or "", tools


async def connect_mcp_server(address: str, *, connect_timeout: float = 10.0,
                             call_timeout: float = 60.0, single_url: bool = False) -> McpServer:
    """Lists the server at `address`; raises ToolSetupError naming it when it cannot be reached.
    single_url: connect to `address` itself only (a URL a request named), never to a guess."""
    reasons = []
    for url in [address] if single_url else candidate_urls(address):
        try:
            name, instructions, tools = await list_server(url, connect_timeout)
        except TimeoutError:
            reasons.append(f"{url}: no answer within {connect_timeout:g} s")
            continue
        except Exception as exc:
            reasons.append(f"{url}: {root_cause(exc)}")
            continue
        label = LABEL_UNSAFE.sub("_", name).strip("_") or LABEL_UNSAFE.sub("_", address).strip("_")
        return McpServer(url, label, instructions, tools, call_timeout)
    raise ToolSetupError(f"MCP server {address} is unreachable ({'; '.join(reasons)})")
