"""The API's ways of asking for a constrained output, as StructuredOutputs: OpenAI's
`response_format` (chat, completions) and `text.format` (Responses), `tool_choice` and strict
tools, vLLM's `structured_outputs` and older `guided_*` fields (chat, completions), Ollama's
`format`. Each error is a 400 naming the request field."""

from __future__ import annotations

import json
from typing import Any

from osserve.errors import InvalidRequestError
from osserve.structured.spec import StructuredOutputs, ToolChoiceMode, ToolSpec


def answer_format(fmt: dict[str, Any] | None, param: str, nested: bool) -> dict[str, Any]:
    """StructuredOutputs fields for an OpenAI format object: {"type": "text" | "json_object" |
    "json_schema", ...}. nested: the schema sits under "json_schema" (chat's response_format), else
    beside the type (Responses' text.format)."""
    if fmt is None:
        return {}
    kind = fmt.get("type", "text")
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"json_object": True}
    if kind != "json_schema":
        raise InvalidRequestError(f"{param}.type must be one of 'text', 'json_object', 'json_schema', got {kind!r}",
                                  f"{param}.type")
    where = f"{param}.json_schema" if nested else param
    body = fmt.get("json_schema") if nested else fmt
    if not isinstance(body, dict):
        raise InvalidRequestError(f"{where} is required with type 'json_schema'", where)
    schema = body.get("schema")
    if not isinstance(schema, dict):
        raise InvalidRequestError(f"{where}.schema is required (a JSON schema object)", f"{where}.schema")
    return {"json_schema": schema}


def format_instructions(fmt: dict[str, Any] | None, nested: bool) -> tuple[str, str, dict[str, Any]] | None:
    """(name, description, schema) of a JSON answer format, for harmony's developer message, or None."""
    if fmt is None or fmt.get("type") not in ("json_object", "json_schema"):
        return None
    if fmt["type"] == "json_object":
        return "json_object", "Answer with one JSON object.", {"type": "object"}
    body = (fmt.get("json_schema") if nested else fmt) or {}
    return str(body.get("name") or "response"), str(body.get("description") or ""), body.get("schema") or {}


def tool_choice_mode(choice: Any, names: list[str]) -> tuple[ToolChoiceMode, str | None]:
    """OpenAI's tool_choice ("auto" | "none" | "required" | {"type": "function", "function":
    {"name"}} | Responses' {"type": "function", "name"}) as (mode, forced name)."""
    if choice is None or choice == "auto":
        return "auto", None
    if choice in ("none", "required"):
        if choice == "required" and not names:
            raise InvalidRequestError("tool_choice 'required' needs at least one tool", "tool_choice")
        return choice, None
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") or choice.get("name")
        if not name:
            raise InvalidRequestError("tool_choice object needs function.name", "tool_choice")
        if name not in names:
            raise InvalidRequestError(f"tool_choice names '{name}', which is not in tools", "tool_choice")
        return "named", name
    raise InvalidRequestError(f"tool_choice must be 'auto', 'none', 'required' or a function, got {choice!r}",
                              "tool_choice")


WEB_SEARCH_TYPES = ("web_search_preview", "web_search_preview_2025_03_11", "web_search", "web_search_2025_08_26")


def responses_tool_choice(choice: Any, tools: list[ToolSpec]) -> tuple[ToolChoiceMode, str | None, list[ToolSpec]]:
    """The Responses API's tool_choice over every declared tool (functions, and the server's tools:
    `browser.*`, `python`, `label.tool`) as (mode, forced function, the tools the turn may call).
    A forced built-in or MCP tool is "required" over that tool's calls only: `{"type":
    "web_search_preview"}` a `browser.search`, `{"type": "code_interpreter"}` a `python` call,
    `{"type": "mcp", "server_label", "name"?}` that server's tool (or any of its tools)."""
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind in (None, "function"):
        functions = [t.name for t in tools if not t.recipient]
        if choice == "required":
            if not tools:
                raise InvalidRequestError("tool_choice 'required' needs at least one tool", "tool_choice")
            return "required", None, tools
        mode, name = tool_choice_mode(choice, functions)
        return mode, name, tools
    if kind in WEB_SEARCH_TYPES:
        subset, what = [t for t in tools if t.recipient == "browser.search"], f"a {kind} tool"
    elif kind == "code_interpreter":
        subset, what = [t for t in tools if t.recipient == "python"], "a code_interpreter tool"
    elif kind == "mcp":
        label, name = choice.get("server_label"), choice.get("name")
        if not isinstance(label, str) or not label:
            raise InvalidRequestError("tool_choice of type 'mcp' needs server_label", "tool_choice.server_label")
        wanted = f"{label}.{name}" if name else None
        subset = [t for t in tools if t.recipient.startswith(label + ".") and wanted in (None, t.recipient)]
        what = f"MCP server '{label}'" + (f" with a tool '{name}'" if name else "")
    else:
        raise InvalidRequestError(f"tool_choice of type {kind!r} is not supported: use 'auto', 'none', 'required', "
                                  "a function, web_search_preview, code_interpreter or mcp", "tool_choice")
    if not subset:
        raise InvalidRequestError(f"tool_choice forces {what}, which is not in tools", "tool_choice")
    return "required", None, subset


def chat_structured(fmt: dict[str, Any] | None, fmt_param: str, nested: bool, tools: list[ToolSpec],
                    tool_choice: Any, vllm: tuple[dict[str, Any], str] | None = None) -> StructuredOutputs | None:
    """The constraint of a harmony chat turn, or None where nothing is constrained. vllm: the answer
    format from vLLM's fields (vllm_format), where the request used them instead of `fmt`."""
    mode, name = tool_choice_mode(tool_choice, [t.name for t in tools])
    fields, param = _one_answer_format(fmt, fmt_param, nested, vllm)
    spec = StructuredOutputs(harmony=True, tools=tools, tool_choice=mode, tool_name=name, answer_param=param,
                             **fields)
    return spec if spec.constrains else None


def completion_structured(fmt: dict[str, Any] | None, vllm: tuple[dict[str, Any], str] | None
                          ) -> StructuredOutputs | None:
    """The constraint of a raw completion (its whole output) from `response_format` or vLLM's
    fields (vllm_format), or None where nothing is constrained."""
    fields, param = _one_answer_format(fmt, "response_format", True, vllm)
    spec = StructuredOutputs(answer_param=param, **fields)
    return spec if spec.constrains else None


def _one_answer_format(fmt: dict[str, Any] | None, fmt_param: str, nested: bool,
                       vllm: tuple[dict[str, Any], str] | None) -> tuple[dict[str, Any], str]:
    fields = answer_format(fmt, fmt_param, nested)
    if vllm is None:
        return fields, fmt_param
    if fields:
        raise InvalidRequestError(f"give {fmt_param} or {vllm[1].split('.')[0]}, not both", vllm[1])
    return vllm


# vLLM's structured_outputs keys and the StructuredOutputs fields they set; its older guided_* fields.
VLLM_KEYS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar",
             "json_object": "json_object"}
GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}


def vllm_format(structured_outputs: Any, guided: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
    """StructuredOutputs fields and the request field they came from, for vLLM's
    `structured_outputs` (exactly one of json, regex, choice, grammar, json_object; a grammar in
    llguidance's Lark dialect) or its older `guided_json` / `guided_regex` / `guided_choice` /
    `guided_grammar` (`guided` maps each such field to its value); None where neither is given."""
    given = {k: v for k, v in guided.items() if v is not None}
    if structured_outputs is not None and given:
        raise InvalidRequestError(f"give structured_outputs or {next(iter(given))}, not both", next(iter(given)))
    if structured_outputs is not None:
        if not isinstance(structured_outputs, dict):
            raise InvalidRequestError("structured_outputs must be an object", "structured_outputs")
        for key in structured_outputs:
            if key not in VLLM_KEYS:
                raise InvalidRequestError(f"structured_outputs.{key} is not supported: give one of "
                                          f"{', '.join(VLLM_KEYS)}", f"structured_outputs.{key}")
        chosen = {k: v for k, v in structured_outputs.items() if v is not None and v is not False}
        if len(chosen) != 1:
            raise InvalidRequestError(f"structured_outputs needs exactly one of {', '.join(VLLM_KEYS)}",
                                      "structured_outputs")
        ((key, value),) = chosen.items()
        param = f"structured_outputs.{key}"
    elif given:
        if len(given) > 1:
            raise InvalidRequestError(f"give one of {', '.join(given)}, not several", next(iter(given)))
        ((field, value),) = given.items()
        key, param = GUIDED[field], field
    else:
        return None
    if key == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as e:
                raise InvalidRequestError(f"{param} is not valid JSON: {e}", param) from None
        if not isinstance(value, dict):
            raise InvalidRequestError(f"{param} must be a JSON schema object", param)
    elif key == "json_object":
        if value is not True:
            raise InvalidRequestError(f"{param} must be true", param)
    elif key == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise InvalidRequestError(f"{param} must be a non-empty list of non-empty strings", param)
    elif not isinstance(value, str) or not value:
        raise InvalidRequestError(f"{param} must be a non-empty string", param)
    return {VLLM_KEYS[key]: value}, param


def ollama_format(fmt: Any) -> dict[str, Any]:
    """StructuredOutputs fields for Ollama's `format`: "json" (a JSON object) or a JSON schema."""
    if fmt is None or fmt == "":
        return {}
    if fmt == "json":
        return {"json_object": True}
    if isinstance(fmt, dict):
        return {"json_schema": fmt}
    raise InvalidRequestError(f"format must be \"json\" or a JSON schema object, got {fmt!r}", "format")
