"""POST /v1/chat/completions: harmony in, reasoning / content / tool calls out, streamed or not."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from osserve.engine.core.outputs import CompletionDelta
from osserve.errors import EngineDeadError, InvalidRequestError
from osserve.harmony.render import ChatMessage, FunctionTool, RenderedPrompt, ResponseFormat, ToolCall, render_chat
from osserve.harmony.stream import (
    ContentDelta,
    Delta,
    HarmonyStreamParser,
    ReasoningDelta,
    ToolCallArgsDelta,
    ToolCallStart,
)
from osserve.server.errors import error_body
from osserve.server.generation import (
    ServerState,
    choice_params,
    constrain,
    generate_n,
    new_id,
    sampling_params,
    sse,
    with_first,
)
from osserve.server.logprobs import chat_logprobs
from osserve.server.protocol import ChatCompletionRequest, ChatMessageIn, ChatTool
from osserve.structured.requests import chat_structured, format_instructions
from osserve.structured.spec import StructuredOutputs, ToolSpec

router = APIRouter()


TEXT_PARTS = ("text", "input_text")


def message_text(index: int, message: ChatMessageIn) -> str | None:
    """A message's text. gpt-oss reads text only: an image, audio or file part is refused by name
    (400) rather than dropped, so a request is never answered as if the model had seen it."""
    if message.content is None or isinstance(message.content, str):
        return message.content
    texts = []
    for j, part in enumerate(message.content):
        if part.type in TEXT_PARTS:
            texts.append(part.text or "")
        elif part.type == "refusal" and message.role == "assistant":
            texts.append(str(getattr(part, "refusal", None) or ""))
        else:
            where = f"messages[{index}].content[{j}]"
            raise InvalidRequestError(f"{where}: content of type {part.type!r} is not supported; this model "
                                      "reads text only", where)
    return "".join(texts)


def to_chat_messages(req: ChatCompletionRequest) -> list[ChatMessage]:
    out = []
    for i, m in enumerate(req.messages):
        calls = [ToolCall(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or []]
        out.append(ChatMessage(role=m.role, content=message_text(i, m), reasoning=m.reasoning or m.reasoning_content,
                               tool_calls=calls, tool_call_id=m.tool_call_id, name=m.name))
    return out


def tool_specs(tools: list[ChatTool] | None) -> list[ToolSpec]:
    return [ToolSpec(t.function.name, t.function.parameters, bool(t.function.strict)) for t in tools or []]


def render_request(req: ChatCompletionRequest) -> tuple[RenderedPrompt, StructuredOutputs | None]:
    """The prompt and the output's constraint (the answer format, forced or forbidden tool calls)."""
    fmt = req.response_format.model_dump(exclude_none=True) if req.response_format is not None else None
    vllm = req.vllm_format()
    spec = chat_structured(fmt, "response_format", True, tool_specs(req.tools), req.tool_choice, vllm)
    tools = [FunctionTool(t.function.name, t.function.description, t.function.parameters)
             for t in req.tools or []]
    if vllm is not None and "json_schema" in vllm[0]:  # shown to the model as response_format's would be
        fmt = {"type": "json_schema", "json_schema": {"name": "response", "schema": vllm[0]["json_schema"]}}
    elif vllm is not None and "json_object" in vllm[0]:
        fmt = {"type": "json_object"}
    told = format_instructions(fmt, nested=True)
    prompt = render_chat(to_chat_messages(req), tools=tools, tool_choice=req.tool_choice or "auto",
                         reasoning_effort=req.reasoning_effort or "medium",
                         response_format=ResponseFormat(*told) if told else None)
    return prompt, spec


class _Choice:
    """One choice's parser and accumulated output."""

    def __init__(self, state: ServerState) -> None:
        self.parser = HarmonyStreamParser(state.tokenizer)
        self.logprobs: list[Any] = []
        self.finish: CompletionDelta | None = None

    def feed(self, d: CompletionDelta) -> list[Delta]:
        deltas = self.parser.push(d.new_token_ids)
        self.logprobs.extend(d.new_logprobs or [])
        if d.finished:
            deltas += self.parser.finish()
            self.finish = d
        return deltas

    def finish_reason(self) -> str:
        assert self.finish is not None
        if self.parser.parsed.finish_reason_hint:
            return "tool_calls"
        reason = self.finish.finish_reason
        return "stop" if reason in ("stop", "abort") else (reason or "stop")


def usage(prompt_len: int, choices: list[_Choice]) -> dict[str, Any]:
    completion = sum(c.finish.num_output_tokens for c in choices if c.finish)
    return {
        "prompt_tokens": prompt_len,
        "completion_tokens": completion,
        "total_tokens": prompt_len + completion,
        "completion_tokens_details": {"reasoning_tokens": sum(c.parser.parsed.reasoning_tokens for c in choices)},
        "prompt_tokens_details": {"cached_tokens": max((c.finish.num_cached_tokens for c in choices if c.finish),
                                                       default=0)},
    }


@router.post("/v1/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Any:
    state: ServerState = request.app.state.osserve
    state.check_model(body.model)
    prompt, spec = render_request(body)
    extra = body.engine_extras()
    base = constrain(sampling_params(
        temperature=body.temperature, top_p=body.top_p, seed=body.seed, stop=body.stop_list(),
        max_tokens=body.max_completion_tokens or body.max_tokens, extra=extra,
        logprobs=(body.top_logprobs or 0) if body.logprobs else None,
    ), spec)
    rid = new_id("chatcmpl")
    stream = generate_n(state, prompt.token_ids, choice_params(base, body.n), rid)
    first = await anext(stream)  # validation errors surface here, before any byte is sent
    choices = [_Choice(state) for _ in range(body.n)]
    created = int(time.time())
    if body.stream:
        return StreamingResponse(
            _stream(state, body, rid, created, first, stream, choices, len(prompt.token_ids)),
            media_type="text/event-stream",
        )
    choices[first[0]].feed(first[1])
    async for i, d in stream:
        choices[i].feed(d)
    for c in choices:
        if c.finish is not None and c.finish.finish_reason == "error":
            raise EngineDeadError(c.finish.error or "the engine failed")
    out = []
    for i, c in enumerate(choices):
        parsed = c.parser.parsed
        # `refusal` is required by OpenAI's schema; gpt-oss has no refusal channel, so it is always null.
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content or None, "refusal": None}
        reasoning = (parsed.reasoning or None) if body.include_reasoning else None
        message["reasoning"] = message["reasoning_content"] = reasoning
        if parsed.tool_calls:
            message["tool_calls"] = [{"id": t.id, "type": "function",
                                      "function": {"name": t.name, "arguments": t.arguments}}
                                     for t in parsed.tool_calls]
        out.append({"index": i, "message": message, "finish_reason": c.finish_reason(),
                    "logprobs": chat_logprobs(state.tokenizer, c.logprobs) if body.logprobs else None})
    return JSONResponse({
        "id": rid, "object": "chat.completion", "created": created, "model": state.model_name,
        "choices": out, "usage": usage(len(prompt.token_ids), choices),
    })


async def _stream(state: ServerState, body: ChatCompletionRequest, rid: str, created: int,
                  first: tuple[int, CompletionDelta], rest: AsyncIterator[tuple[int, CompletionDelta]],
                  choices: list[_Choice], prompt_len: int) -> AsyncIterator[str]:
    def chunk(i: int, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> str:
        return sse({"id": rid, "object": "chat.completion.chunk", "created": created,
                    "model": state.model_name,
                    "choices": [{"index": i, "delta": delta, "finish_reason": finish, "logprobs": logprobs}]})

    for i in range(body.n):
        yield chunk(i, {"role": "assistant", "content": ""})

    async for i, d in with_first(first, rest):
        c = choices[i]
        lp = chat_logprobs(state.tokenizer, d.new_logprobs) if body.logprobs and d.new_logprobs else None
        for x in c.feed(d):
            if isinstance(x, ReasoningDelta):
                if body.include_reasoning:
                    yield chunk(i, {"reasoning": x.text, "reasoning_content": x.text}, logprobs=lp)
            elif isinstance(x, ContentDelta):
                yield chunk(i, {"content": x.text}, logprobs=lp)
            elif isinstance(x, ToolCallStart):
                yield chunk(i, {"tool_calls": [{"index": x.index, "id": x.id, "type": "function",
                                                "function": {"name": x.name, "arguments": ""}}]})
            elif isinstance(x, ToolCallArgsDelta):
                yield chunk(i, {"tool_calls": [{"index": x.index, "function": {"arguments": x.text}}]})
            lp = None  # logprobs ride on the first chunk of the step
        if d.finished:
            if d.finish_reason == "error":  # the error ends this choice: no finish chunk to follow it
                yield sse(error_body(d.error or "engine error", "internal_error"))
                continue
            yield chunk(i, {}, c.finish_reason())
    if body.stream_options and body.stream_options.include_usage:
        yield sse({"id": rid, "object": "chat.completion.chunk", "created": created,
                   "model": state.model_name, "choices": [], "usage": usage(prompt_len, choices)})
    yield sse("[DONE]")
