"""POST /v1/responses, GET /v1/responses/{id}: OpenAI's Responses API over harmony.

Input items map onto chat messages (a `function_call` is an assistant tool call, a
`function_call_output` a tool result, a `reasoning` item the assistant's analysis); with
`previous_response_id` the stored conversation comes first. Output items: reasoning, message,
function_call. Streaming follows the standard event sequence, each event with a sequence_number.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from osserve.engine.core.outputs import CompletionDelta
from osserve.errors import InvalidRequestError, NotFoundError
from osserve.harmony.render import ChatMessage, FunctionTool, ResponseFormat, ToolCall, render_chat
from osserve.harmony.stream import (
    ContentDelta,
    HarmonyStreamParser,
    ParsedOutput,
    ReasoningDelta,
    ToolCallArgsDelta,
    ToolCallStart,
)
from osserve.server.generation import ServerState, constrain, generate, new_id, sampling_params, sse, with_first
from osserve.server.protocol import ResponsesRequest
from osserve.server.responses_store import StoredResponse
from osserve.structured.requests import chat_structured, format_instructions
from osserve.structured.spec import ToolSpec

router = APIRouter()
FINAL_EVENT = {"completed": "response.completed", "incomplete": "response.incomplete", "failed": "response.failed"}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or [] if isinstance(p, dict))


TEXT_PARTS = ("input_text", "output_text", "text")


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


def items_to_messages(items: str | list[dict[str, Any]]) -> list[ChatMessage]:
    if isinstance(items, str):
        return [ChatMessage("user", items)]
    out: list[ChatMessage] = []
    for i, it in enumerate(items):
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
            call = ToolCall(it.get("call_id", ""), it.get("name", ""), it.get("arguments", "{}"))
            if out and out[-1].role == "assistant" and not out[-1].content:
                out[-1].tool_calls.append(call)
            else:
                out.append(ChatMessage("assistant", None, tool_calls=[call]))
        elif kind == "function_call_output":
            out.append(ChatMessage("tool", str(it.get("output", "")), tool_call_id=it.get("call_id")))
        else:
            raise InvalidRequestError(f"input item type {kind!r} is not supported", "input")
    return out


def output_text_part(text: str) -> dict[str, Any]:
    # `logprobs` is required by OpenAI's schema; osserve does not compute them for Responses yet.
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def output_items(parsed: ParsedOutput, ids: dict[str, str], cut: bool = False) -> list[dict[str, Any]]:
    """The output items of a finished response; `cut` (by max_output_tokens or a failure) marks the
    last one incomplete."""
    items: list[dict[str, Any]] = []
    if parsed.reasoning:
        items.append({"type": "reasoning", "id": ids["reasoning"], "summary": [],
                      "content": [{"type": "reasoning_text", "text": parsed.reasoning}], "status": "completed"})
    if parsed.content:
        items.append({"type": "message", "id": ids["message"], "role": "assistant", "status": "completed",
                      "content": [output_text_part(parsed.content)]})
    for i, call in enumerate(parsed.tool_calls):
        items.append({"type": "function_call", "id": f"fc_{call.id}", "call_id": call.id, "name": call.name,
                      "arguments": call.arguments, "status": "completed", "_index": i})
    for it in items:
        it.pop("_index", None)
    if cut and items:
        items[-1]["status"] = "incomplete"
    return items


def echoed_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The request's tools as a response states them: a function tool has every field OpenAI's schema
    requires (`strict` and `parameters` may be null; `strict` echoes the request)."""
    out = []
    for t in tools or []:
        if t.get("type") == "function":
            t = {**t, "description": t.get("description"), "parameters": t.get("parameters"),
                 "strict": t.get("strict")}
        out.append(t)
    return out


def outcome(last: CompletionDelta | None) -> tuple[str, dict[str, Any] | None, dict[str, Any] | None]:
    """A finished response's status, incomplete_details and error, from its last delta. A grammar's
    dead end (structured outputs: no token allowed) fails the response, saying so."""
    if last is not None and last.finish_reason in ("error", "grammar"):
        return "failed", None, {"code": "server_error", "message": last.error or "the engine failed"}
    if last is not None and last.finish_reason == "length":
        # The cap is max_output_tokens, or the model's context when that is lower: both cut the output.
        return "incomplete", {"reason": "max_output_tokens"}, None
    return "completed", None, None


def response_object(rid: str, body: ResponsesRequest, model: str, created: int, status: str,
                    output: list[dict[str, Any]], usage: dict[str, Any] | None,
                    incomplete_details: dict[str, Any] | None = None,
                    error: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": rid, "object": "response", "created_at": created, "model": model, "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "output": output, "usage": usage, "instructions": body.instructions,
            "previous_response_id": body.previous_response_id, "error": error,
            "incomplete_details": incomplete_details,
            "tools": echoed_tools(body.tools), "tool_choice": body.tool_choice or "auto",
            "parallel_tool_calls": True, "temperature": body.temperature, "top_p": body.top_p,
            "max_output_tokens": body.max_output_tokens, "metadata": {}, "text": {"format": text_format(body)},
            "reasoning": body.reasoning or {"effort": "medium"}, "store": body.store}


def text_format(body: ResponsesRequest) -> dict[str, Any]:
    return dict((body.text or {}).get("format") or {"type": "text"})


def function_tools(body: ResponsesRequest) -> list[ToolSpec]:
    """The request's function tools as the constraint takes them: strict unless the request says
    otherwise (the Responses API's default, unlike Chat Completions')."""
    return [ToolSpec(t.get("name", ""), t.get("parameters"), t.get("strict") is not False)
            for t in body.tools or [] if t.get("type") == "function"]


def response_usage(prompt_len: int, last: CompletionDelta | None, parsed: ParsedOutput) -> dict[str, Any]:
    out_tokens = last.num_output_tokens if last else 0
    # cache_write_tokens (required by OpenAI's schema) is 0: the prefix cache keeps computed blocks as a
    # side effect of serving, and nothing counts them as cache writes.
    return {"input_tokens": prompt_len, "output_tokens": out_tokens, "total_tokens": prompt_len + out_tokens,
            "input_tokens_details": {"cached_tokens": last.num_cached_tokens if last else 0,
                                     "cache_write_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": parsed.reasoning_tokens}}


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, request: Request) -> Any:
    state: ServerState = request.app.state.osserve
    item = state.responses.get(response_id)
    if item is None:
        raise NotFoundError(f"no stored response with id '{response_id}'", "response_id")
    return JSONResponse(item.body)


@router.post("/v1/responses")
async def create_response(body: ResponsesRequest, request: Request) -> Any:
    state: ServerState = request.app.state.osserve
    state.check_model(body.model)
    history: list[ChatMessage] = []
    instructions = body.instructions
    if body.previous_response_id:
        prev = state.responses.get(body.previous_response_id)
        if prev is None:
            raise InvalidRequestError(f"previous_response_id '{body.previous_response_id}' is unknown or "
                                      "was evicted", "previous_response_id")
        history = list(prev.conversation)
        instructions = instructions or prev.instructions
    new_messages = items_to_messages(body.input)
    conversation = history + new_messages
    tools = [FunctionTool(t.get("name", ""), t.get("description") or "", t.get("parameters"))
             for t in body.tools or [] if t.get("type") == "function"]
    fmt = text_format(body)
    spec = chat_structured(fmt, "text.format", False, function_tools(body), body.tool_choice)
    told = format_instructions(fmt, nested=False)
    effort = (body.reasoning or {}).get("effort") or "medium"
    if effort not in ("low", "medium", "high"):
        raise InvalidRequestError(f"reasoning.effort must be low, medium or high, got {effort!r}", "reasoning.effort")
    system = [ChatMessage("developer", instructions)] if instructions else []
    prompt = render_chat(system + conversation, tools=tools, tool_choice=body.tool_choice or "auto",
                         reasoning_effort=effort,  # type: ignore[arg-type]  # checked just above
                         response_format=ResponseFormat(*told) if told else None)
    params = constrain(sampling_params(temperature=body.temperature, top_p=body.top_p,
                                       max_tokens=body.max_output_tokens, seed=body.seed,
                                       extra={"ignore_eos": body.ignore_eos}), spec)
    rid = new_id("resp_")
    ids = {"reasoning": new_id("rs_"), "message": new_id("msg_")}
    created = int(time.time())
    deltas = generate(state, prompt.token_ids, params, rid)
    first = await anext(deltas)
    parser = HarmonyStreamParser(state.tokenizer)

    def finish(last: CompletionDelta | None) -> dict[str, Any]:
        parsed = parser.parsed
        status, incomplete_details, error = outcome(last)
        obj = response_object(rid, body, state.model_name, created, status,
                              output_items(parsed, ids, cut=status != "completed"),
                              response_usage(len(prompt.token_ids), last, parsed), incomplete_details, error)
        if body.store:
            out_msgs = [ChatMessage("assistant", parsed.content or None, reasoning=parsed.reasoning or None,
                                    tool_calls=[ToolCall(c.id, c.name, c.arguments) for c in parsed.tool_calls])]
            state.responses.put(rid, StoredResponse(obj, conversation + out_msgs, instructions))
        return obj

    if body.stream:
        return StreamingResponse(_stream(state, body, rid, created, ids, first, deltas, parser, finish),
                                 media_type="text/event-stream")
    last = first
    parser.push(first.new_token_ids)
    async for d in deltas:
        parser.push(d.new_token_ids)
        last = d
    parser.finish()
    return JSONResponse(finish(last))


async def _stream(state: ServerState, body: ResponsesRequest, rid: str, created: int, ids: dict[str, str],
                  first: CompletionDelta, rest: AsyncIterator[CompletionDelta], parser: HarmonyStreamParser,
                  finish: Any) -> AsyncIterator[str]:
    seq = 0

    def event(kind: str, **data: Any) -> str:
        nonlocal seq
        payload = {"type": kind, "sequence_number": seq, **data}
        seq += 1
        return sse(payload, event=kind)

    shell = response_object(rid, body, state.model_name, created, "in_progress", [], None)
    yield event("response.created", response=shell)
    yield event("response.in_progress", response=shell)
    out_index = -1
    open_item: dict[str, Any] | None = None  # the item being streamed, with its text so far

    def close(status: str = "completed") -> list[str]:
        nonlocal open_item
        if open_item is None:
            return []
        it, events = open_item, []
        if it["type"] == "reasoning":
            events.append(event("response.reasoning_text.done", item_id=it["id"], output_index=out_index,
                                content_index=0, text=it["text"]))
            part = {"type": "reasoning_text", "text": it["text"]}
            events.append(event("response.content_part.done", item_id=it["id"], output_index=out_index,
                                content_index=0, part=part))
            item = {"type": "reasoning", "id": it["id"], "summary": [], "content": [part], "status": status}
        elif it["type"] == "message":
            events.append(event("response.output_text.done", item_id=it["id"], output_index=out_index,
                                content_index=0, text=it["text"], logprobs=[]))
            part = output_text_part(it["text"])
            events.append(event("response.content_part.done", item_id=it["id"], output_index=out_index,
                                content_index=0, part=part))
            item = {"type": "message", "id": it["id"], "role": "assistant", "status": status, "content": [part]}
        else:
            events.append(event("response.function_call_arguments.done", item_id=it["id"],
                                output_index=out_index, name=it["name"], arguments=it["text"]))
            item = {"type": "function_call", "id": it["id"], "call_id": it["call_id"], "name": it["name"],
                    "arguments": it["text"], "status": status}
        events.append(event("response.output_item.done", output_index=out_index, item=item))
        open_item = None
        return events

    def open_new(kind: str, **extra: Any) -> list[str]:
        nonlocal open_item, out_index
        events = close()
        out_index += 1
        if kind == "reasoning":
            item_id = ids["reasoning"]
            item = {"type": "reasoning", "id": item_id, "summary": [], "content": [], "status": "in_progress"}
            part: dict[str, Any] | None = {"type": "reasoning_text", "text": ""}
        elif kind == "message":
            item_id = ids["message"]
            item = {"type": "message", "id": item_id, "role": "assistant", "status": "in_progress", "content": []}
            part = output_text_part("")
        else:
            item_id = f"fc_{extra['call_id']}"
            item = {"type": "function_call", "id": item_id, "call_id": extra["call_id"], "name": extra["name"],
                    "arguments": "", "status": "in_progress"}
            part = None
        events.append(event("response.output_item.added", output_index=out_index, item=item))
        if part is not None:
            events.append(event("response.content_part.added", item_id=item_id, output_index=out_index,
                                content_index=0, part=part))
        open_item = {"type": kind, "id": item_id, "text": "", **extra}
        return events

    last: CompletionDelta | None = None
    async for d in with_first(first, rest):
        last = d
        produced = parser.push(d.new_token_ids) + (parser.finish() if d.finished else [])
        for x in produced:
            if isinstance(x, ReasoningDelta | ContentDelta):
                kind = "reasoning" if isinstance(x, ReasoningDelta) else "message"
                if open_item is None or open_item["type"] != kind:
                    for e in open_new(kind):
                        yield e
                assert open_item is not None
                open_item["text"] += x.text
                if kind == "reasoning":
                    yield event("response.reasoning_text.delta", item_id=open_item["id"], output_index=out_index,
                                content_index=0, delta=x.text)
                else:
                    yield event("response.output_text.delta", item_id=open_item["id"], output_index=out_index,
                                content_index=0, delta=x.text, logprobs=[])
            elif isinstance(x, ToolCallStart):
                for e in open_new("function_call", call_id=x.id, name=x.name):
                    yield e
            elif isinstance(x, ToolCallArgsDelta) and open_item is not None:
                open_item["text"] += x.text
                yield event("response.function_call_arguments.delta", item_id=open_item["id"],
                            output_index=out_index, delta=x.text)
    status, _, _ = outcome(last)
    for e in close("completed" if status == "completed" else "incomplete"):
        yield e
    final = finish(last)
    yield event(FINAL_EVENT[final["status"]], response=final)
