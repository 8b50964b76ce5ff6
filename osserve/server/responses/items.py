"""A Responses request's input items as chat messages (harmony/render.py renders them).

A `message` is a message, a `reasoning` item the assistant's analysis, a `function_call` an
assistant call and a `function_call_output` its result. The server's own tool items, sent back as
input by clients that keep the history themselves (the Agents SDK does), are calls with their
results: a `code_interpreter_call` is a `python` call and its logs, an `mcp_call` a call of
`label.tool` and its output or error. A `web_search_call` keeps no page text to show again and an
`mcp_list_tools` nothing the namespace does not say: both are left out.
"""

from __future__ import annotations

import json
from typing import Any

from osserve.errors import InvalidRequestError
from osserve.harmony.render import ChatMessage, ToolCall

TEXT_PARTS = ("input_text", "output_text", "text")
LEFT_OUT = ("web_search_call", "mcp_list_tools")


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or [] if isinstance(p, dict))


def message_text(index: int, content: Any) -> str:
    """An input message's text. gpt-oss reads text only: an image, file or audio part is refused by
    name (400) rather than dropped, so a request is never answered as if the model had seen it."""
    if isinstance(content, str) or content is None:
        return content or ""
    if not isinstance(content, list):
        raise InvalidRequestError(f"input[{index}].content must be a string or a list of parts",
                                  f"input[{index}].content")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS:
            texts.append(str(part.get("text") or ""))
        elif kind == "refusal":
            texts.append(str(part.get("refusal") or ""))
        else:
            where = f"input[{index}].content[{j}]"
            raise InvalidRequestError(f"{where}: content of type {kind!r} is not supported; this model reads "
                                      "text only", where)
    return "".join(texts)


def _add_call(out: list[ChatMessage], call: ToolCall) -> None:
    """A call joins the assistant turn before it (its reasoning), or starts one."""
    if out and out[-1].role == "assistant" and not out[-1].content:
        out[-1].tool_calls.append(call)
    else:
        out.append(ChatMessage("assistant", None, tool_calls=[call]))


def text_field(item: dict[str, Any], key: str, index: int, default: str = "") -> str:
    """An input item's text field (a call's arguments, its code, a name): a string, or absent."""
    value = item.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise InvalidRequestError(f"input[{index}].{key} must be a string", f"input[{index}].{key}")
    return value


def code_interpreter_logs(item: dict[str, Any], index: int) -> str:
    outputs = item.get("outputs") or []
    if not isinstance(outputs, list):
        raise InvalidRequestError(f"input[{index}].outputs must be a list of outputs", f"input[{index}].outputs")
    return "".join(str(o.get("logs") or "") for o in outputs if isinstance(o, dict) and o.get("type") == "logs")


def mcp_error_text(error: Any) -> str:
    """An mcp_call's error as the model was shown it."""
    if isinstance(error, dict):
        content = error.get("content", error.get("message", ""))
        if isinstance(content, list):
            return "".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
        return content if isinstance(content, str) else json.dumps(content)
    return str(error)


def items_to_messages(items: str | list[dict[str, Any]]) -> list[ChatMessage]:
    if isinstance(items, str):
        return [ChatMessage("user", items)]
    out: list[ChatMessage] = []
    for i, it in enumerate(items):
        if not isinstance(it, dict):
            raise InvalidRequestError(f"input[{i}] must be an object", f"input[{i}]")
        kind = it.get("type", "message")
        if kind == "message":
            role = it.get("role", "user")
            if role not in ("user", "system", "developer", "assistant"):
                raise InvalidRequestError(f"unknown message role {role!r}", "input")
            out.append(ChatMessage(role, message_text(i, it.get("content"))))
        elif kind == "reasoning":
            text = _text(it.get("content")) or _text(it.get("summary"))
            out.append(ChatMessage("assistant", None, reasoning=text))
        elif kind == "function_call":
            _add_call(out, ToolCall(text_field(it, "call_id", i), text_field(it, "name", i),
                                    text_field(it, "arguments", i, "{}")))
        elif kind == "function_call_output":
            out.append(ChatMessage("tool", str(it.get("output", "")), tool_call_id=it.get("call_id")))
        elif kind == "code_interpreter_call":
            call_id = text_field(it, "id", i) or f"ci_{i}"
            code = text_field(it, "code", i)
            _add_call(out, ToolCall(call_id, "python", code, recipient="python", channel="analysis"))
            out.append(ChatMessage("tool", code_interpreter_logs(it, i), tool_call_id=call_id))
        elif kind == "mcp_call":
            call_id, name = text_field(it, "id", i) or f"mcp_{i}", text_field(it, "name", i)
            recipient = f"{text_field(it, 'server_label', i) or 'mcp'}.{name}"
            _add_call(out, ToolCall(call_id, name, text_field(it, "arguments", i, "{}"), recipient=recipient))
            result = text_field(it, "output", i) if it.get("error") is None else mcp_error_text(it.get("error"))
            out.append(ChatMessage("tool", result, tool_call_id=call_id))
        elif kind in LEFT_OUT:
            continue
        else:
            raise InvalidRequestError(f"input item type {kind!r} is not supported", "input")
    return out
