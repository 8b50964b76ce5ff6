"""A Responses request's `tools`, resolved against the server's: what the model is shown, what its
calls may be constrained to, and where each call it makes goes.

    {"type": "function", "name", "parameters", "strict"?}     the client runs it (the response ends)
    {"type": "web_search_preview"} (or web_search*)           the built-in browser (`--tool-server demo`)
    {"type": "code_interpreter", "container": {"type": "auto"}}   the built-in python
    {"type": "mcp", "server_label", "allowed_tools"?, "require_approval": "never", "server_url"?}

Only declared tools are shown: browser and python in harmony's system message, each MCP server as a
namespace of its own in the developer message, named by the request's `server_label`. An MCP
server is one the operator started (`--tool-server URL`, whose label is the name it reports) or,
with `server_url`, one at a URL the operator allowed (`--allow-tool-server-url`): any other URL is
a 400 before any connection is made. Tool approvals are not supported: the server runs the tools it
is given (`require_approval` "never", or left out).
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from typing import Any

from osserve.errors import InvalidRequestError, ToolServerUnavailableError, ToolSetupError
from osserve.harmony.render import FunctionTool, ToolNamespaces
from osserve.structured.grammar import schema_compiles
from osserve.structured.requests import WEB_SEARCH_TYPES
from osserve.structured.spec import ToolSpec
from osserve.tools.browser.tool import ARGUMENT_SCHEMAS
from osserve.tools.mcp_client import McpServer
from osserve.tools.registry import RESERVED_LABELS, ToolServers

LABEL = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
PYTHON = ToolSpec("python", recipient="python", channel="analysis", free_text=True)
BROWSER = [ToolSpec(f"browser.{name}", schema, recipient=f"browser.{name}", channel="analysis")
           for name, schema in ARGUMENT_SCHEMAS.items()]


@dataclass
class RequestTools:
    functions: list[FunctionTool] = field(default_factory=list)
    function_specs: list[ToolSpec] = field(default_factory=list)
    browser: bool = False
    python: bool = False
    mcp: dict[str, McpServer] = field(default_factory=dict)  # by the request's label, its allowed tools only

    @property
    def server_tools(self) -> bool:
        """Whether the server runs any of the tools (else a response is one generation, as before)."""
        return self.browser or self.python or bool(self.mcp)

    def specs(self) -> list[ToolSpec]:
        """Every declared tool, for the output grammar."""
        specs = list(self.function_specs)
        if self.browser:
            specs += BROWSER
        if self.python:
            specs.append(PYTHON)
        for label, server in self.mcp.items():
            for t in server.tools.values():
                schema = closed(t.input_schema)
                specs.append(ToolSpec(f"{label}.{t.name}", schema if _compiles(schema) else None,
                                      recipient=f"{label}.{t.name}"))
        return specs

    def namespaces(self, servers: ToolServers | None) -> ToolNamespaces:
        out = ToolNamespaces()
        if servers is not None and self.browser and servers.browser is not None:
            out.builtin.append(servers.browser.namespace_config())
        if servers is not None and self.python and servers.python is not None:
            out.builtin.append(servers.python.namespace_config())
        out.developer = [server.namespace_config() for server in self.mcp.values()]
        return out

    def route(self, recipient: str) -> str:
        """Who runs a call to `recipient`: "function" (the client), "browser", "python", "mcp",
        or "unknown" (a tool not declared here: the model is told so and goes on)."""
        namespace, _, function = recipient.partition(".")
        if namespace == "functions" or recipient in {f.name for f in self.functions}:
            return "function"
        if recipient == "python" and self.python:
            return "python"
        if namespace == "browser" and function and self.browser:
            return "browser"
        if namespace in self.mcp and function:
            return "mcp"
        return "unknown"


def closed(schema: dict[str, Any]) -> dict[str, Any]:
    """An MCP tool's arguments as a forced call's grammar takes them: the properties it declares and
    no others (JSON Schema's default would let a call add keys without end)."""
    if schema.get("type") == "object" and "additionalProperties" not in schema and "properties" in schema:
        return {**schema, "additionalProperties": False}
    return schema


@functools.lru_cache(maxsize=1024)
def _compiles_text(schema_json: str) -> bool:
    return schema_compiles(json.loads(schema_json))


def _compiles(schema: dict[str, Any]) -> bool:
    return _compiles_text(json.dumps(schema, sort_keys=True))


def _needs(servers: ToolServers | None, what: str, present: bool, kind: str, where: str) -> None:
    if servers is None or not present:
        raise InvalidRequestError(f"{where}: the {kind} tool needs the server's built-in {what}: start it with "
                                  f"--tool-server demo (or {what})", where)


async def resolve_tools(tools: list[dict[str, Any]] | None, servers: ToolServers | None) -> RequestTools:
    """The request's tools; InvalidRequestError (400) names the field of a tool this server cannot
    give, ToolServerUnavailableError (424) an allowed MCP server that cannot be reached."""
    out = RequestTools()
    for i, tool in enumerate(tools or []):
        where = f"tools[{i}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind == "function":
            name = tool.get("name")
            if not isinstance(name, str) or not name:
                raise InvalidRequestError(f"{where}.name is required for a function tool", f"{where}.name")
            if not isinstance(tool.get("parameters"), dict | None):
                raise InvalidRequestError(f"{where}.parameters must be a JSON Schema object", f"{where}.parameters")
            out.functions.append(FunctionTool(name, tool.get("description") or "", tool.get("parameters")))
            # Strict unless the request says otherwise: the Responses API's default, unlike Chat Completions'.
            out.function_specs.append(ToolSpec(name, tool.get("parameters"), tool.get("strict") is not False))
        elif kind in WEB_SEARCH_TYPES:
            _needs(servers, "browser", servers is not None and servers.browser is not None, kind, where)
            out.browser = True
        elif kind == "code_interpreter":
            _needs(servers, "python", servers is not None and servers.python is not None, kind, where)
            container = tool.get("container", {"type": "auto"})
            if not isinstance(container, dict) or container.get("type") != "auto":
                raise InvalidRequestError(f"{where}.container: only {{\"type\": \"auto\"}} is supported (each "
                                          "conversation gets a sandboxed python session of its own)",
                                          f"{where}.container")
            out.python = True
        elif kind == "mcp":
            label, server = await _mcp_server(tool, servers, where)
            if label in out.mcp:
                raise InvalidRequestError(f"{where}.server_label '{label}' is declared twice", f"{where}.server_label")
            out.mcp[label] = server
        else:
            raise InvalidRequestError(f"{where}: tools of type {kind!r} are not supported; this server runs function, "
                                      "web_search_preview, code_interpreter and mcp tools", f"{where}.type")
    names = [f.name for f in out.functions]
    if len(set(names)) != len(names):
        raise InvalidRequestError("function tool names must be distinct", "tools")
    return out


async def _mcp_server(tool: dict[str, Any], servers: ToolServers | None, where: str) -> tuple[str, McpServer]:
    label = tool.get("server_label")
    if not isinstance(label, str) or not LABEL.match(label) or label in RESERVED_LABELS:
        raise InvalidRequestError(f"{where}.server_label must be 1-64 letters, digits, '_' or '-', and not one of "
                                  f"{', '.join(RESERVED_LABELS)}", f"{where}.server_label")
    for unsupported in ("connector_id", "tunnel_id", "headers", "authorization"):
        if tool.get(unsupported):
            raise InvalidRequestError(f"{where}.{unsupported} is not supported: this server connects to MCP servers "
                                      "itself, without a client's credentials", f"{where}.{unsupported}")
    approval = tool.get("require_approval")
    if not (approval in (None, "never") or (isinstance(approval, dict) and "always" not in approval)):
        raise InvalidRequestError(f"{where}.require_approval: tool approvals are not supported; this server runs "
                                  "the MCP tools it is given (require_approval: \"never\")",
                                  f"{where}.require_approval")
    url = tool.get("server_url")
    if url is not None:
        if not isinstance(url, str) or servers is None or not servers.allows(url):
            # Decided from the text alone: a URL the operator did not allow is never connected to.
            raise InvalidRequestError(f"{where}.server_url: this server connects only to the MCP servers its operator "
                                      "allowed (osserve serve --allow-tool-server-url URL)", f"{where}.server_url")
        try:
            server = await servers.url_server(url)
        except ToolSetupError as exc:
            raise ToolServerUnavailableError(f"Error retrieving tool list from MCP server '{label}': {exc}",
                                             f"{where}.server_url") from exc
    elif servers is not None and label in servers.mcp:
        server = servers.mcp[label]
    else:
        known = ", ".join(sorted(servers.mcp)) if servers is not None and servers.mcp else "none"
        raise InvalidRequestError(f"{where}: no MCP server labelled '{label}' here (this server's: {known}); give "
                                  "server_url where the operator allowed it", f"{where}.server_label")
    allowed = _allowed_tools(tool.get("allowed_tools"), where)
    if allowed is not None:
        missing = [name for name in allowed if name not in server.tools]
        if missing:
            raise InvalidRequestError(f"{where}.allowed_tools names {', '.join(missing)}, which MCP server '{label}' "
                                      f"does not have (it has: {', '.join(server.tools) or 'none'})",
                                      f"{where}.allowed_tools")
    relabeled = server.relabeled(label)
    if allowed is not None:
        relabeled.tools = {name: t for name, t in relabeled.tools.items() if name in allowed}
    return label, relabeled


def _allowed_tools(value: Any, where: str) -> list[str] | None:
    if value is None:
        return None
    names = value.get("tool_names") if isinstance(value, dict) else value
    if names is None and isinstance(value, dict):
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise InvalidRequestError(f"{where}.allowed_tools must be a list of tool names or {{\"tool_names\": [...]}}",
                                  f"{where}.allowed_tools")
    return None if "*" in names else names
