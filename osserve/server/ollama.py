"""Ollama's API: POST /api/chat, POST /api/generate (NDJSON streaming by default, `think`,
`options`), GET /api/tags, GET /api/version — so Ollama clients and UIs work unchanged."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from osserve import __version__
from osserve.engine.core.outputs import CompletionDelta
from osserve.harmony.render import ChatMessage, FunctionTool, ToolCall, render_chat
from osserve.harmony.stream import ContentDelta, HarmonyStreamParser, ReasoningDelta
from osserve.server.generation import ServerState, generate, new_id, sampling_params, with_first

router = APIRouter()


class OllamaMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str = ""
    thinking: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_name: str | None = None


class OllamaOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1)
    num_predict: int | None = None
    seed: int | None = None
    stop: list[str] | None = None
    min_p: float | None = Field(default=None, ge=0, le=1)
    repeat_penalty: float | None = Field(default=None, gt=0)


class OllamaChatRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str
    messages: list[OllamaMessage] = Field(default_factory=list)
    stream: bool = True
    think: bool | str | None = None
    options: OllamaOptions | None = None
    tools: list[dict[str, Any]] | None = None


class OllamaGenerateRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str
    prompt: str = ""
    system: str | None = None
    stream: bool = True
    think: bool | str | None = None
    raw: bool = False
    options: OllamaOptions | None = None


def _params(opts: OllamaOptions | None) -> Any:
    o = opts or OllamaOptions()
    extra: dict[str, Any] = {}
    if o.top_k is not None:
        extra["top_k"] = o.top_k
    if o.min_p is not None:
        extra["min_p"] = o.min_p
    if o.repeat_penalty is not None:
        extra["repetition_penalty"] = o.repeat_penalty
    max_tokens = None if o.num_predict is None or o.num_predict < 0 else max(1, o.num_predict)
    return sampling_params(temperature=o.temperature, top_p=o.top_p, max_tokens=max_tokens, seed=o.seed,
                           stop=o.stop, extra=extra)


def _effort(think: bool | str | None) -> str:
    return think if isinstance(think, str) and think in ("low", "medium", "high") else "medium"


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


async def _run(state: ServerState, prompt: list[int], prefill: list[int], params: Any, stream: bool,
               shape: Any) -> Any:
    """Drive one generation; `shape(delta_text, thinking_text, final)` builds each NDJSON object."""
    start = time.monotonic_ns()
    deltas = generate(state, prompt, params, new_id("ollama"))
    first = await anext(deltas)
    parser = HarmonyStreamParser(state.tokenizer, prefill)

    def split(d: CompletionDelta) -> tuple[str, str]:
        out = parser.push(d.new_token_ids) + (parser.finish() if d.finished else [])
        content = "".join(x.text for x in out if isinstance(x, ContentDelta))
        thinking = "".join(x.text for x in out if isinstance(x, ReasoningDelta))
        return content, thinking

    def final_fields(d: CompletionDelta) -> dict[str, Any]:
        took = time.monotonic_ns() - start
        return {"done": True, "done_reason": "length" if d.finish_reason == "length" else "stop",
                "total_duration": took, "load_duration": 0, "prompt_eval_count": len(prompt),
                "prompt_eval_duration": 0, "eval_count": d.num_output_tokens, "eval_duration": took}

    if stream:
        async def lines() -> AsyncIterator[str]:
            async for d in with_first(first, deltas):
                content, thinking = split(d)
                if content or thinking:
                    yield json.dumps(shape(content, thinking, parser, None)) + "\n"
                if d.finished:
                    yield json.dumps(shape("", "", parser, final_fields(d))) + "\n"
        return StreamingResponse(lines(), media_type="application/x-ndjson")
    last = first
    async for d in with_first(first, deltas):
        split(d)
        last = d
    p = parser.parsed
    return JSONResponse(shape(p.content, p.reasoning, parser, final_fields(last)))


@router.post("/api/chat")
async def ollama_chat(body: OllamaChatRequest, request: Request) -> Any:
    state: ServerState = request.app.state.osserve
    state.check_model(body.model)
    messages = []
    for m in body.messages:
        calls = [ToolCall(new_id("call_"), c.get("function", {}).get("name", ""),
                          json.dumps(c.get("function", {}).get("arguments", {}))) for c in m.tool_calls or []]
        if m.role == "tool":  # Ollama names the tool instead of a call id
            messages.append(ChatMessage("tool", m.content, name=m.tool_name))
        else:
            messages.append(ChatMessage(m.role, m.content, reasoning=m.thinking, tool_calls=calls))  # type: ignore[arg-type]
    tools = [FunctionTool(t["function"]["name"], t["function"].get("description", ""),
                          t["function"].get("parameters")) for t in body.tools or [] if "function" in t]
    prompt = render_chat(messages, tools=tools, reasoning_effort=_effort(body.think))  # type: ignore[arg-type]
    show_thinking = body.think is not False

    def shape(content: str, thinking: str, parser: HarmonyStreamParser, final: dict | None) -> dict:
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if show_thinking and thinking:
            msg["thinking"] = thinking
        if final is not None and parser.parsed.tool_calls:
            msg["tool_calls"] = [{"function": {"name": c.name, "arguments": _json_or_text(c.arguments)}}
                                 for c in parser.parsed.tool_calls]
        return {"model": body.model, "created_at": _now(), "message": msg, **(final or {"done": False})}

    return await _run(state, prompt.token_ids, prompt.prefill_token_ids, _params(body.options), body.stream, shape)


@router.post("/api/generate")
async def ollama_generate(body: OllamaGenerateRequest, request: Request) -> Any:
    state: ServerState = request.app.state.osserve
    state.check_model(body.model)
    if body.raw:
        prompt_ids, prefill = state.tokenizer.encode(body.prompt), []
    else:
        msgs = ([ChatMessage("system", body.system)] if body.system else []) + [ChatMessage("user", body.prompt)]
        rendered = render_chat(msgs, reasoning_effort=_effort(body.think))  # type: ignore[arg-type]
        prompt_ids, prefill = rendered.token_ids, rendered.prefill_token_ids
    show_thinking = body.think is not False

    def shape(content: str, thinking: str, parser: HarmonyStreamParser, final: dict | None) -> dict:
        out: dict[str, Any] = {"model": body.model, "created_at": _now(), "response": content}
        if show_thinking and thinking:
            out["thinking"] = thinking
        return {**out, **(final or {"done": False})}

    return await _run(state, prompt_ids, prefill, _params(body.options), body.stream, shape)


@router.get("/api/tags")
async def ollama_tags(request: Request) -> Any:
    state: ServerState = request.app.state.osserve
    return {"models": [{"name": state.model_name, "model": state.model_name, "modified_at": _now(), "size": 0,
                        "digest": "", "details": {"format": "safetensors", "family": "gpt-oss",
                                                  "families": ["gpt-oss"], "quantization_level": "MXFP4"}}]}


@router.get("/api/version")
async def ollama_version() -> Any:
    return {"version": __version__}


def _json_or_text(s: str) -> Any:
    try:
        return json.loads(s)
    except ValueError:
        return s
