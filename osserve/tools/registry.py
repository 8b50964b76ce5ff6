"""The tool servers the Responses loop may call: `--tool-server LIST` parsed, the tools built, and
for each what the loop needs: a harmony namespace to show the model and an async `call`.

LIST is comma-separated: `demo` (the built-in browser over the shipped documents, and python),
`browser` or `python` alone, and MCP server addresses (see mcp_client.py). Everything is checked
at start: an unknown name, an unreachable server, two servers with one label, or a python tool that
cannot be isolated (without the unsafe flag) is a ToolSetupError naming the culprit.

Per conversation, `open_conversation()` gives a `ConversationTools`: the browser's page stack and
the python session live there, so cursors and variables carry from one call to the next. A call
never raises: a bad recipient, bad arguments or a failing tool come back as a `ToolResult` with
`is_error`, whose text the model is shown.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

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


@dataclass(frozen=True)
class ToolServerOptions:
    python_limits: SandboxLimits = field(default_factory=SandboxLimits)
    allow_unsafe_python_tool: bool = False
    browser_backend: BrowserBackend | None = None  # e.g. ExaBackend(); default: offline documents
    browser_documents: Path | None = None  # the offline backend's folder; default: the shipped demo
    mcp_connect_timeout: float = 10.0
    mcp_call_timeout: float = 60.0


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

    def __init__(self, browser: BrowserTool | None, python: PythonTool | None, mcp: list[McpServer]) -> None:
        self.browser = browser
        self.python = python
        self.mcp = {server.label: server for server in mcp}

    @classmethod
    async def start(cls, spec: str, options: ToolServerOptions | None = None) -> ToolServers:
        options = options or ToolServerOptions()
        entries = parse_tool_servers(spec)
        browser = python = None
        mcp: list[McpServer] = []
        try:
            if {"demo", "browser"} & set(entries):
                from osserve.tools.browser.offline import OfflineBackend

                try:
                    backend = options.browser_backend or OfflineBackend(options.browser_documents)
                except OSError as exc:
                    raise ToolSetupError(f"the browser cannot start: {exc}") from exc
                browser = BrowserTool(backend)
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
        return cls(browser, python, mcp)

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

    def open_conversation(self) -> ConversationTools:
        return ConversationTools(self)

    async def close(self) -> None:
        if self.python is not None:
            await self.python.close()
        if self.browser is not None:
            await self.browser.aclose()


class ConversationTools:
    """One conversation's tool state (browser page stack, python session) and its calls."""

    def __init__(self, servers: ToolServers) -> None:
        self.servers = servers
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
            text, failed = await self.browser.call(function, arguments_text)
            return ToolResult(text, is_error=failed)
        server = servers.mcp.get(namespace)
        if server is not None and function:
            try:
                arguments = json.loads(arguments_text) if arguments_text.strip() else {}
            except json.JSONDecodeError as exc:
                return ToolResult(f"Invalid JSON arguments for {recipient}: {exc}", is_error=True)
            if not isinstance(arguments, dict):
                return ToolResult(f"The arguments for {recipient} must be a JSON object", is_error=True)
            result = await server.call(function, arguments)
            return ToolResult(result.text, result.is_error)
        return ToolResult(f"No tool `{recipient}` is available here", is_error=True)

    async def close(self) -> None:
        if self.python is not None and self.servers.python is not None:
            await self.servers.python.release(self.python)
            self.python = None
