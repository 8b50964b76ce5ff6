"""The tool servers the Responses loop may call: `--tool-server LIST` parsed, the tools built, and
for each what the loop needs: a harmony namespace to show the model and an async `call`.

LIST is comma-separated: `demo` (the built-in browser over the shipped documents, and python),
`browser` or `python` alone, and MCP server addresses (see mcp_client.py). Everything is checked
at start: an unknown name, an unreachable server, two servers with one label, or a python tool that
cannot be isolated (without the unsafe flag) is a ToolSetupError naming the culprit.

A request may also name an MCP server by URL (the Responses API's `server_url`) only where the
operator allowed that very URL (`allowed_server_urls`, `--allow-tool-server-url`): `allows(url)` is
checked before any connection is made; `url_server(url)` then lists it (cached for a minute).

Per conversation, `open_conversation()` gives a `ConversationTools`: the browser's page stack and
the python session live there, so cursors and variables carry from one call to the next. A call
never raises: a bad recipient, bad arguments or a failing tool come back as a `ToolResult` with
`is_error`, whose text the model is shown.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from openai_harmony import ToolNamespaceConfig

from osserve.errors import ToolSetupError
from osserve.tools.browser.backend import BrowserBackend
from osserve.tools.browser.tool import BrowserSession, BrowserTool
from osserve.tools.mcp_client import McpServer, connect_mcp_server
from osserve.tools.python.sandbox import SandboxLimits
from osserve.tools.python.session import PythonSession
from osserve.tools.python.tool import PythonTool

BUILTIN_NAMES = ("demo", "browser", "python")
RESERVED_LABELS = ("browser", "python", "functions", "assistant", "user", "system", "developer")


@dataclass(frozen=True)
class ToolResult:
    text: str  # what the model is shown, as the tool's message
    is_error: bool = False


URL_SERVER_TTL_S = 60.0  # how long a request-named MCP server's tool list is reused


@dataclass(frozen=True)
class ToolServerOptions:
    """Plain data (it crosses to the HTTP server processes), but for a backend object given directly."""

    python_limits: SandboxLimits = field(default_factory=SandboxLimits)
    allow_unsafe_python_tool: bool = False
    browser_backend: BrowserBackend | None = None  # e.g. ExaBackend(); default: by `browser`
    browser: str = "offline"  # the backend when none is given: "offline" (documents) or "exa" (EXA_API_KEY)
    browser_documents: Path | None = None  # the offline backend's folder; default: the shipped demo
    mcp_connect_timeout: float = 10.0
    mcp_call_timeout: float = 60.0
    browser_call_timeout: float = 60.0  # one browser call (a search, an open) at most
    allowed_server_urls: tuple[str, ...] = ()  # MCP server URLs a request may name


def normalized_url(url: str) -> str:
    """A URL as the allow-list compares it: scheme and host lowercased, no trailing slash, no
    fragment; anything that is not a plain http(s) URL (credentials, other schemes) is returned
    unchanged, so it matches only itself spelled the same."""
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname
    except ValueError:
        return url
    if parts.scheme.lower() not in ("http", "https") or not host or parts.username or parts.password:
        return url
    netloc = host.lower() + (f":{parts.port}" if parts.port is not None else "")
    return urlunsplit((parts.scheme.lower(), netloc, parts.path.rstrip("/"), parts.query, ""))


def parse_tool_servers(spec: str) -> list[str]:
    """The entries of a `--tool-server` value, checked for form (not yet for reachability)."""
    entries = [part.strip() for part in spec.split(",") if part.strip()]
    if not entries:
        raise ToolSetupError("--tool-server is empty: give `demo` and/or MCP server URLs")
    for entry in entries:
        if entry in BUILTIN_NAMES or re.match(r"^https?://[^\s/]+", entry) or re.match(r"^[\w.-]+:\d+$", entry):
            continue
        raise ToolSetupError(f"unknown tool server `{entry}`: use demo, browser, python, or an MCP server "
                             "URL such as http://127.0.0.1:8001/mcp (or .../sse)")
    return entries


class ToolServers:
    """The built tools; make it with `await ToolServers.start(spec, options)`."""

    def __init__(self, browser: BrowserTool | None, python: PythonTool | None, mcp: list[McpServer],
                 options: ToolServerOptions | None = None) -> None:
        self.browser = browser
        self.python = python
        self.mcp = {server.label: server for server in mcp}
        self.options = options or ToolServerOptions()
        self._allowed = {normalized_url(url) for url in self.options.allowed_server_urls}
        self._url_servers: dict[str, tuple[float, McpServer]] = {}

    @classmethod
    async def start(cls, spec: str | None, options: ToolServerOptions | None = None) -> ToolServers:
        """The tools of `spec` (None: none, only the allowed request-named MCP servers)."""
        options = options or ToolServerOptions()
        entries = parse_tool_servers(spec) if spec is not None else []
        browser = python = None
        mcp: list[McpServer] = []
        try:
            if {"demo", "browser"} & set(entries):
                browser = BrowserTool(make_browser_backend(options))
            if {"demo", "python"} & set(entries):
                python = await PythonTool.create(options.python_limits,
                                                 allow_unsafe=options.allow_unsafe_python_tool)
            for entry in entries:
                if entry in BUILTIN_NAMES:
                    continue
                server = await connect_mcp_server(entry, connect_timeout=options.mcp_connect_timeout,
                                                  call_timeout=options.mcp_call_timeout)
                if server.label in RESERVED_LABELS or server.label in {s.label for s in mcp}:
                    raise ToolSetupError(f"MCP server {entry} reports the name `{server.label}`, which "
                                         "another tool already has")
                mcp.append(server)
        except BaseException:
            await cls(browser, python, mcp).close()
            raise
        return cls(browser, python, mcp, options)

    def namespaces(self) -> dict[str, ToolNamespaceConfig]:
        """Every namespace by name: `browser`, `python`, and each MCP server's label."""
        found: dict[str, ToolNamespaceConfig] = {}
        if self.browser is not None:
            found["browser"] = self.browser.namespace_config()
        if self.python is not None:
            found["python"] = self.python.namespace_config()
        for label, server in self.mcp.items():
            found[label] = server.namespace_config()
        return found

    def has(self, namespace: str) -> bool:
        return namespace in self.namespaces()

    def allows(self, url: str) -> bool:
        """Whether a request may name this MCP server URL: the operator allowed it, or started the
        server with it (`--tool-server`). Decided from the text alone: nothing is connected."""
        wanted = normalized_url(url)
        return wanted in self._allowed or any(normalized_url(s.url) == wanted for s in self.mcp.values())

    async def url_server(self, url: str) -> McpServer:
        """The MCP server at an allowed URL, listed (ToolSetupError when it cannot be reached).
        The caller checks `allows(url)` first."""
        if not self.allows(url):
            raise ToolSetupError(f"MCP server {url} is not allowed")
        key = normalized_url(url)
        for server in self.mcp.values():
            if normalized_url(server.url) == key:
                return server
        cached = self._url_servers.get(key)
        if cached is not None and time.monotonic() - cached[0] < URL_SERVER_TTL_S:
            return cached[1]
        server = await connect_mcp_server(url, connect_timeout=self.options.mcp_connect_timeout,
                                          call_timeout=self.options.mcp_call_timeout, single_url=True)
        self._url_servers[key] = (time.monotonic(), server)
        return server

    def open_conversation(self) -> ConversationTools:
        return ConversationTools(self)

    async def close(self) -> None:
        if self.python is not None:
            await self.python.close()
        if self.browser is not None:
            await self.browser.aclose()


def make_browser_backend(options: ToolServerOptions) -> BrowserBackend:
    if options.browser_backend is not None:
        return options.browser_backend
    if options.browser == "exa":
        from osserve.tools.browser.exa import ExaBackend

        return ExaBackend()
    if options.browser != "offline":
        raise ToolSetupError(f"unknown browser backend `{options.browser}`: use offline or exa")
    from osserve.tools.browser.offline import OfflineBackend

    try:
        return OfflineBackend(options.browser_documents)
    except OSError as exc:
        raise ToolSetupError(f"the browser cannot start: {exc}") from exc


class ConversationTools:
    """One conversation's tool state (browser page stack, python session) and its calls."""

    def __init__(self, servers: ToolServers) -> None:
        self.servers = servers
        self.id = "cntr_" + secrets.token_hex(12)  # the python session's container, as the Responses API names it
        self.browser: BrowserSession | None = servers.browser.new_session() if servers.browser else None
        self.python: PythonSession | None = None

    async def call(self, recipient: str, arguments_text: str) -> ToolResult:
        """Runs the tool a harmony message addresses (`browser.search`, `python`, `label.tool`)
        with the message's text: JSON arguments, or the code for python."""
        namespace, _, function = recipient.partition(".")
        servers = self.servers
        if namespace == "python" and servers.python is not None and not function:
            if self.python is None:
                self.python = servers.python.new_session()
            return ToolResult(await servers.python.run(self.python, arguments_text))
        if namespace == "browser" and self.browser is not None:
            limit = servers.options.browser_call_timeout
            try:
                text, failed = await asyncio.wait_for(self.browser.call(function, arguments_text), limit)
            except TimeoutError:
                return ToolResult(f"The browser call `{recipient}` timed out after {limit:g} seconds", is_error=True)
            return ToolResult(text, is_error=failed)
        server = servers.mcp.get(namespace)
        if server is not None and function:
            return await call_mcp(server, function, arguments_text)
        return ToolResult(f"No tool `{recipient}` is available here", is_error=True)

    async def close(self) -> None:
        if self.python is not None and self.servers.python is not None:
            await self.servers.python.release(self.python)
            self.python = None


async def call_mcp(server: McpServer, function: str, arguments_text: str) -> ToolResult:
    """Calls tool `function` of an MCP server with the model's JSON arguments; never raises."""
    recipient = f"{server.label}.{function}"
    try:
        arguments = json.loads(arguments_text) if arguments_text.strip() else {}
    except json.JSONDecodeError as exc:
        return ToolResult(f"Invalid JSON arguments for {recipient}: {exc}", is_error=True)
    if not isinstance(arguments, dict):
        return ToolResult(f"The arguments for {recipient} must be a JSON object", is_error=True)
    result = await server.call(function, arguments)
    return ToolResult(result.text, result.is_error)
