"""POST /v1/responses, GET /v1/responses/{id}: OpenAI's Responses API over harmony.

Input items map onto chat messages (items.py); with `previous_response_id` the stored conversation
comes first, and the conversation's tool state (browser pages, python variables) goes on. The
request's tools are resolved against the server's (request_tools.py); the response runs as a loop
over the model's steps and the server's tool calls (loop.py), its items and stream events made by
output.py. Streaming follows OpenAI's event sequence, each event with a sequence_number.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from osserve.errors import InvalidRequestError, NotFoundError
from osserve.harmony.render import ChatMessage, ResponseFormat, render_chat
from osserve.server.generation import ServerState, new_id, sampling_params
from osserve.server.protocol import ResponsesRequest
from osserve.server.responses.items import items_to_messages
from osserve.server.responses.loop import ResponseLoop, StepSpecs
from osserve.server.responses.output import OutputStream
from osserve.server.responses.request_tools import RequestTools, resolve_tools
from osserve.server.responses_store import StoredResponse
from osserve.structured.requests import answer_format, format_instructions, responses_tool_choice
from osserve.structured.spec import StructuredOutputs
from osserve.tools.registry import ConversationTools

router = APIRouter()
FINAL_EVENT = {"completed": "response.completed", "incomplete": "response.incomplete", "failed": "response.failed"}
DEFAULT_MAX_TOOL_CALLS = 10  # the server's tool calls in one response, unless the request says


def echoed_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The request's tools as a response states them: a function tool has every field OpenAI's schema
    requires (`strict` and `parameters` may be null; `strict` echoes the request), a code
    interpreter its container."""
    out = []
    for t in tools or []:
        if t.get("type") == "function":
            t = {**t, "description": t.get("description"), "parameters": t.get("parameters"),
                 "strict": t.get("strict")}
        elif t.get("type") == "code_interpreter":
            t = {"container": {"type": "auto"}, **t}
        out.append(t)
    return out


def outcome(loop: ResponseLoop) -> tuple[str, dict[str, Any] | None, dict[str, Any] | None]:
    """A finished response's status, incomplete_details and error. A grammar's dead end (structured
    outputs: no token allowed) fails the response, saying so."""
    last = loop.last
    if last is not None and last.finish_reason in ("error", "grammar"):
        return "failed", None, {"code": "server_error", "message": last.error or "the engine failed"}
    if loop.cut_short or (last is not None and last.finish_reason == "length"):
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
            "max_output_tokens": body.max_output_tokens, "max_tool_calls": body.max_tool_calls,
            "metadata": {}, "text": {"format": text_format(body)},
            "reasoning": body.reasoning or {"effort": "medium"}, "store": body.store}


def text_format(body: ResponsesRequest) -> dict[str, Any]:
    fmt = (body.text or {}).get("format") or {"type": "text"}
    if not isinstance(fmt, dict):
        raise InvalidRequestError("text.format must be an object such as {\"type\": \"text\"}", "text.format")
    return dict(fmt)


def step_specs(body: ResponsesRequest, tools: RequestTools, max_tool_calls: int) -> StepSpecs:
    """Each step's output constraint (loop.py): the answer format throughout; the first step's
    tool_choice (a forced tool binds it alone); no server tool past max_tool_calls."""
    specs = tools.specs()
    mode, name, first_tools = responses_tool_choice(body.tool_choice, specs)
    answer = answer_format(text_format(body), "text.format", nested=False)
    forces_server_tool = mode == "required" and all(t.recipient for t in first_tools)
    if max_tool_calls == 0 and forces_server_tool:
        raise InvalidRequestError("tool_choice forces a tool the server runs, but max_tool_calls is 0",
                                  "max_tool_calls")

    def spec(**kw: Any) -> StructuredOutputs | None:
        made = StructuredOutputs(harmony=True, answer_param="text.format", **answer, **kw)
        return made if made.constrains else None

    later = "none" if mode == "none" else "auto"
    past_limit = spec(tools=tools.function_specs, tool_choice=later, closed_tools=True)
    if max_tool_calls == 0 and mode != "named":
        first = past_limit
    else:
        first = spec(tools=first_tools, tool_choice=mode, tool_name=name)
    return StepSpecs(first, spec(tools=specs, tool_choice=later), past_limit)


def mcp_list_tools(out: OutputStream, tools: RequestTools, listed: list[str]) -> list[str]:
    """An `mcp_list_tools` item for each MCP server the conversation has not listed yet (OpenAI's
    rule): the labels listed."""
    new = [label for label in tools.mcp if label not in listed]
    for label in new:
        item = {"type": "mcp_list_tools", "id": new_id("mcpl_"), "server_label": label, "error": None,
                "tools": [{"name": t.name, "description": t.description or None, "input_schema": t.input_schema,
                           "annotations": None} for t in tools.mcp[label].tools.values()]}
        index = out.add({**item, "tools": []})
        out.event("response.mcp_list_tools.in_progress", item_id=item["id"], output_index=index)
        out.event("response.mcp_list_tools.completed", item_id=item["id"], output_index=index)
        out.done(index, item)
    return new


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
    listed: list[str] = []
    if body.previous_response_id:
        prev = state.responses.get(body.previous_response_id)
        if prev is None:
            raise InvalidRequestError(f"previous_response_id '{body.previous_response_id}' is unknown or "
                                      "was evicted", "previous_response_id")
        history, listed = list(prev.conversation), list(prev.mcp_listed)
        instructions = instructions or prev.instructions
    conversation = history + items_to_messages(body.input)
    effort = (body.reasoning or {}).get("effort") or "medium"
    if effort not in ("low", "medium", "high"):
        raise InvalidRequestError(f"reasoning.effort must be low, medium or high, got {effort!r}", "reasoning.effort")
    tools = await resolve_tools(body.tools, state.tools)
    max_tool_calls = DEFAULT_MAX_TOOL_CALLS if body.max_tool_calls is None else body.max_tool_calls
    specs = step_specs(body, tools, max_tool_calls)
    told = format_instructions(text_format(body), nested=False)
    system = [ChatMessage("developer", instructions)] if instructions else []
    prompt = render_chat(system + conversation, tools=tools.functions,
                         tool_choice="none" if body.tool_choice == "none" else "auto",
                         reasoning_effort=effort,  # type: ignore[arg-type]  # checked just above
                         response_format=ResponseFormat(*told) if told else None,
                         namespaces=tools.namespaces(state.tools))
    params = sampling_params(temperature=body.temperature, top_p=body.top_p, max_tokens=body.max_output_tokens,
                             seed=body.seed, extra={"ignore_eos": body.ignore_eos})
    found = state.tool_states.find(body.previous_response_id)
    tool_state = found or (state.tools.open_conversation() if state.tools is not None and tools.server_tools
                           else None)
    browser = tool_state.browser if tool_state is not None and tools.browser else None
    citations = None if browser is None else (lambda text: [
        {"type": "url_citation", "url": c.url, "title": c.title, "start_index": c.start, "end_index": c.end}
        for c in browser.citations(text)])
    rid = new_id("resp_")
    out = OutputStream(body.stream, citations)
    loop = ResponseLoop(state, rid, prompt.token_ids, params, specs, tools, tool_state, out, max_tool_calls)
    try:
        await loop.start()
    except BaseException:
        await _release(state, tool_state, stored=False)
        raise
    created = int(time.time())
    new_listed: list[str] = []  # the MCP servers listed in this response

    async def finish() -> dict[str, Any]:
        status, incomplete_details, error = outcome(loop)
        obj = response_object(rid, body, state.model_name, created, status, out.items, loop.usage.as_dict(),
                              incomplete_details, error)
        if body.store:
            state.responses.put(rid, StoredResponse(obj, conversation + loop.messages, instructions,
                                                    listed + new_listed))
        await _release(state, tool_state, stored=body.store, response_id=rid)
        return obj

    if not body.stream:
        try:
            new_listed = mcp_list_tools(out, tools, listed)
            async for _ in loop.run():
                pass
        except BaseException:  # the engine failed or the request was cancelled: the tools are let go
            await _release(state, tool_state, stored=False)
            raise
        return JSONResponse(await finish())

    async def events() -> AsyncIterator[str]:
        nonlocal new_listed
        finished = False
        try:
            shell = response_object(rid, body, state.model_name, created, "in_progress", [], None)
            out.event("response.created", response=shell)
            out.event("response.in_progress", response=shell)
            new_listed = mcp_list_tools(out, tools, listed)
            for e in out.drain():
                yield e
            async for _ in loop.run():
                for e in out.drain():
                    yield e
            final = await finish()
            finished = True
            out.event(FINAL_EVENT[final["status"]], response=final)
            for e in out.drain():
                yield e
        finally:
            if not finished:  # the client went away mid-response
                await _release(state, tool_state, stored=False)

    return StreamingResponse(events(), media_type="text/event-stream")


async def _release(state: ServerState, tools: ConversationTools | None, stored: bool,
                   response_id: str | None = None) -> None:
    """A response's tool state: kept with the stored response, else let go."""
    if tools is None:
        return
    if stored and response_id is not None:
        await state.tool_states.keep(response_id, tools)
    else:
        await state.tool_states.release(tools)
