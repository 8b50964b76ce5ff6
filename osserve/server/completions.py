"""POST /v1/completions: a raw prompt (text or token ids), no template; `echo`, `logprobs`; the
whole output may follow `response_format` or vLLM's `structured_outputs` / `guided_*`."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from osserve.engine.core.outputs import CompletionDelta, TokenLogprob
from osserve.errors import EngineDeadError, InvalidRequestError
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
from osserve.server.logprobs import completion_logprobs
from osserve.server.protocol import CompletionRequest
from osserve.structured.requests import completion_structured

router = APIRouter()


def prompt_ids(state: ServerState, prompt: Any) -> list[int]:
    if isinstance(prompt, str):
        return state.tokenizer.encode(prompt)
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) == 1:
        return prompt_ids(state, prompt[0])
    raise InvalidRequestError("only one prompt per request is supported (a string or a list of token ids)",
                              "prompt")


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request) -> Any:
    state: ServerState = request.app.state.osserve
    state.check_model(body.model)
    ids = prompt_ids(state, body.prompt)
    extra = body.engine_extras()
    # The harmony stop tokens stay the defaults: a raw prompt may still end inside a harmony turn.
    base = sampling_params(temperature=body.temperature, top_p=body.top_p, max_tokens=body.max_tokens,
                           seed=body.seed, stop=body.stop_list(), extra=extra, logprobs=body.logprobs)
    fmt = body.response_format.model_dump(exclude_none=True) if body.response_format is not None else None
    base = constrain(base, completion_structured(fmt, body.vllm_format()))
    rid = new_id("cmpl")
    stream = generate_n(state, ids, choice_params(base, body.n), rid)
    first = await anext(stream)
    created = int(time.time())
    echo = state.tokenizer.decode(ids) if body.echo else ""
    if body.stream:
        return StreamingResponse(_stream(state, body, rid, created, first, stream, echo, len(ids)),
                                 media_type="text/event-stream")
    texts = [[echo] for _ in range(body.n)]
    lps: list[list[TokenLogprob]] = [[] for _ in range(body.n)]
    finals: list[CompletionDelta | None] = [None] * body.n

    def take(i: int, d: CompletionDelta) -> None:
        texts[i].append(d.new_text)
        lps[i].extend(d.new_logprobs or [])
        if d.finished:
            finals[i] = d

    take(*first)
    async for i, d in stream:
        take(i, d)
    for f in finals:
        if f is not None and f.finish_reason == "error":
            raise EngineDeadError(f.error or "the engine failed")
    choices = [{"index": i, "text": "".join(texts[i]), "finish_reason": _reason(finals[i]),
                "logprobs": completion_logprobs(state.tokenizer, lps[i], len(echo))
                if body.logprobs is not None else None} for i in range(body.n)]
    completion = sum(f.num_output_tokens for f in finals if f)
    return JSONResponse({"id": rid, "object": "text_completion", "created": created,
                         "model": state.model_name, "choices": choices,
                         "usage": _usage(len(ids), completion, finals)})


def _reason(d: CompletionDelta | None) -> str:
    return "length" if d is not None and d.finish_reason == "length" else "stop"


def _usage(prompt: int, completion: int, finals: list[CompletionDelta | None]) -> dict[str, Any]:
    cached = max((f.num_cached_tokens for f in finals if f), default=0)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


async def _stream(state: ServerState, body: CompletionRequest, rid: str, created: int,
                  first: tuple[int, CompletionDelta], rest: AsyncIterator[tuple[int, CompletionDelta]],
                  echo: str, prompt_len: int) -> AsyncIterator[str]:
    def chunk(i: int, text: str, finish: str | None, lp: Any = None) -> str:
        return sse({"id": rid, "object": "text_completion", "created": created, "model": state.model_name,
                    "choices": [{"index": i, "text": text, "finish_reason": finish, "logprobs": lp}]})

    if echo:
        for i in range(body.n):
            yield chunk(i, echo, None)
    finals: list[CompletionDelta | None] = [None] * body.n

    async for i, d in with_first(first, rest):
        lp = (completion_logprobs(state.tokenizer, d.new_logprobs or [])
              if body.logprobs is not None else None)
        if d.new_text or lp:
            yield chunk(i, d.new_text, None, lp)
        if d.finished:
            finals[i] = d
            if d.finish_reason == "error":  # the error ends this choice: no finish chunk to follow it
                yield sse(error_body(d.error or "engine error", "internal_error"))
                continue
            yield chunk(i, "", _reason(d))
    if body.stream_options and body.stream_options.include_usage:
        completion = sum(f.num_output_tokens for f in finals if f)
        yield sse({"id": rid, "object": "text_completion", "created": created, "model": state.model_name,
                   "choices": [], "usage": _usage(prompt_len, completion, finals)})
    yield sse("[DONE]")
