"""Ollama's API, so the `ollama` client library, Open WebUI and other Ollama clients work unchanged:
POST /api/chat and /api/generate (NDJSON streaming by default, `think`, `options`, tools), GET
/api/tags (the model list), POST /api/show, GET /api/ps (the loaded model), GET /api/version.

Durations are Ollama's, in nanoseconds, and measured: `load_duration` is the time the request
waited for the model (Ollama counts its wait for a runner; here, the engine's queue),
`prompt_eval_duration` from then to the first token (the prompt's prefill), `eval_duration` from
the first token to the last, `total_duration` from the request's arrival to its end."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from osserve import __version__
from osserve.engine.core.outputs import CompletionDelta
from osserve.harmony.render import ChatMessage, FunctionTool, ResponseFormat, ToolCall, render_chat
from osserve.harmony.stream import ContentDelta, HarmonyStreamParser, ReasoningDelta
from osserve.model.card import ModelCard
from osserve.server.generation import ServerState, constrain, generate, new_id, sampling_params, with_first
from osserve.structured.requests import ollama_format
from osserve.structured.spec import StructuredOutputs

router = APIRouter()
FAMILY = "gptoss"  # Ollama's name for the architecture
# osserve keeps the model loaded for as long as it runs: Ollama's answer for keep_alive -1.
FOREVER = timedelta(days=365 * 290)


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
    format: str | dict[str, Any] | None = None  # "json" or a JSON schema: the answer follows it


class OllamaGenerateRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str
    prompt: str = ""
    system: str | None = None
    stream: bool = True
    think: bool | str | None = None
    raw: bool = False
    options: OllamaOptions | None = None
    format: str | dict[str, Any] | None = None


class OllamaShowRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    name: str | None = None  # the older field


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


def _time(t: datetime | float | None = None) -> str:
    when = datetime.fromtimestamp(t, UTC) if isinstance(t, float) else t or datetime.now(UTC)
    return when.isoformat().replace("+00:00", "Z")


@dataclass
class _Clock:
    """A request's moments, in time.monotonic_ns(): its arrival, its hand-over to the engine, its
    first token."""

    arrived: int
    submitted: int = 0
    first_token: int | None = None

    def durations(self, last: CompletionDelta, prompt_tokens: int) -> dict[str, Any]:
        end = time.monotonic_ns()
        waited = int((last.queue_time or 0.0) * 1e9)  # in the engine's queue, before its first step
        first = self.first_token or end
        return {"total_duration": end - self.arrived, "load_duration": waited,
                "prompt_eval_count": prompt_tokens,
                "prompt_eval_duration": max(0, first - self.submitted - waited),
                "eval_count": last.num_output_tokens, "eval_duration": end - first}


def _format(fmt: Any, harmony: bool) -> tuple[StructuredOutputs | None, ResponseFormat | None]:
    """Ollama's `format` as the output's constraint and, in a chat, the developer message's format."""
    fields = ollama_format(fmt)
    if not fields:
        return None, None
    spec = StructuredOutputs(harmony=harmony, answer_param="format", **fields)
    schema = fields.get("json_schema", {"type": "object"})
    return spec, ResponseFormat("response", "", schema) if harmony else None


async def _run(state: ServerState, clock: _Clock, prompt: list[int], params: Any,
               stream: bool, shape: Any) -> Any:
    """Drive one generation; `shape(delta_text, thinking_text, parser, final)` builds each NDJSON object."""
    clock.submitted = time.monotonic_ns()
    deltas = generate(state, prompt, params, new_id("ollama"))
    first = await anext(deltas)
    parser = HarmonyStreamParser(state.tokenizer)

    def split(d: CompletionDelta) -> tuple[str, str]:
        if d.new_token_ids and clock.first_token is None:
            clock.first_token = time.monotonic_ns()
        out = parser.push(d.new_token_ids) + (parser.finish() if d.finished else [])
        content = "".join(x.text for x in out if isinstance(x, ContentDelta))
        thinking = "".join(x.text for x in out if isinstance(x, ReasoningDelta))
        return content, thinking

    def final_fields(d: CompletionDelta) -> dict[str, Any]:
        return {"done": True, "done_reason": "length" if d.finish_reason == "length" else "stop",
                **clock.durations(d, len(prompt))}

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


def _loaded(model: str, clock: _Clock, **fields: Any) -> JSONResponse:
    """Ollama's answer to an empty prompt or message list: the model is loaded (here it always is)."""
    return JSONResponse({"model": model, "created_at": _time(), **fields, "done": True, "done_reason": "load",
                         "total_duration": time.monotonic_ns() - clock.arrived, "load_duration": 0})


@router.post("/api/chat")
async def ollama_chat(body: OllamaChatRequest, request: Request) -> Any:
    clock = _Clock(time.monotonic_ns())
    state: ServerState = request.app.state.osserve
    state.check_model(body.model)
    if not body.messages:
        return _loaded(body.model, clock, message={"role": "assistant", "content": ""})
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
    spec, told = _format(body.format, harmony=True)
    prompt = render_chat(messages, tools=tools, reasoning_effort=_effort(body.think),  # type: ignore[arg-type]
                         response_format=told)
    params = constrain(_params(body.options), spec)
    show_thinking = body.think is not False

    def shape(content: str, thinking: str, parser: HarmonyStreamParser, final: dict | None) -> dict:
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if show_thinking and thinking:
            msg["thinking"] = thinking
        if final is not None and parser.parsed.tool_calls:
            msg["tool_calls"] = [{"function": {"name": c.name, "arguments": _json_or_text(c.arguments)}}
                                 for c in parser.parsed.tool_calls]
        return {"model": body.model, "created_at": _time(), "message": msg, **(final or {"done": False})}

    return await _run(state, clock, prompt.token_ids, params, body.stream, shape)


@router.post("/api/generate")
async def ollama_generate(body: OllamaGenerateRequest, request: Request) -> Any:
    clock = _Clock(time.monotonic_ns())
    state: ServerState = request.app.state.osserve
    state.check_model(body.model)
    if not body.prompt and not body.system:
        return _loaded(body.model, clock, response="")
    spec, told = _format(body.format, harmony=not body.raw)
    if body.raw:
        prompt_ids = state.tokenizer.encode(body.prompt)
    else:
        msgs = ([ChatMessage("system", body.system)] if body.system else []) + [ChatMessage("user", body.prompt)]
        prompt_ids = render_chat(msgs, reasoning_effort=_effort(body.think),  # type: ignore[arg-type]
                                 response_format=told).token_ids
    params = constrain(_params(body.options), spec)
    show_thinking = body.think is not False

    def shape(content: str, thinking: str, parser: HarmonyStreamParser, final: dict | None) -> dict:
        out: dict[str, Any] = {"model": body.model, "created_at": _time(), "response": content}
        if show_thinking and thinking:
            out["thinking"] = thinking
        return {**out, **(final or {"done": False})}

    return await _run(state, clock, prompt_ids, params, body.stream, shape)


def _details(card: ModelCard | None) -> dict[str, Any]:
    details: dict[str, Any] = {"parent_model": "", "format": "safetensors", "family": FAMILY, "families": [FAMILY]}
    if card is not None:
        details |= {"parameter_size": card.parameter_size, "quantization_level": card.quantization}
    return details


def _entry(state: ServerState, card: ModelCard | None) -> dict[str, Any]:
    """The model as /api/tags and /api/ps list it."""
    return {"name": state.model_name, "model": state.model_name,
            "modified_at": _time(card.modified_at if card else None), "size": card.weight_bytes if card else 0,
            "digest": card.digest if card else "", "details": _details(card)}


@router.get("/api/tags")
async def ollama_tags(request: Request) -> Any:
    return {"models": [_entry(request.app.state.osserve, request.app.state.model_card)]}


@router.get("/api/ps")
async def ollama_ps(request: Request) -> Any:
    state: ServerState = request.app.state.osserve
    card: ModelCard | None = request.app.state.model_card
    return {"models": [{**_entry(state, card), "expires_at": _time(datetime.now(UTC) + FOREVER),
                        "size_vram": card.weight_bytes if card and card.on_gpu else 0,
                        "context_length": state.engine.max_model_len}]}


@router.post("/api/show")
async def ollama_show(body: OllamaShowRequest, request: Request) -> Any:
    state: ServerState = request.app.state.osserve
    state.check_model(body.model or body.name or "")
    card: ModelCard | None = request.app.state.model_card
    info: dict[str, Any] = {"general.architecture": FAMILY}
    if card is not None:
        info |= {"general.parameter_count": card.parameter_count, f"{FAMILY}.context_length": card.context_length}
        info |= {f"{FAMILY}.{k}": v for k, v in card.shape.items()}
    return {"modelfile": f"FROM {state.model_name}\n", "parameters": "temperature 1\ntop_p 1", "template": "",
            "details": _details(card), "model_info": info, "capabilities": ["completion", "tools", "thinking"],
            "modified_at": _time(card.modified_at if card else None)}


@router.get("/api/version")
async def ollama_version() -> Any:
    return {"version": __version__}


def _json_or_text(s: str) -> Any:
    try:
        return json.loads(s)
    except ValueError:
        return s
