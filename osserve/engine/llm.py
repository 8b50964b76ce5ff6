"""LLM: offline generation — `LLM(model=DIR).generate(prompts, params)` and `.chat(messages)`."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from osserve.engine.core.outputs import RequestOutput, TokenLogprob
from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.engine import LLMEngine
from osserve.engine.load import EngineArgs, build_engine
from osserve.harmony.render import ChatMessage, Effort, FunctionTool, ResponseFormat, render_chat
from osserve.harmony.stream import ParsedOutput, parse_completion
from osserve.structured.grammar import check
from osserve.structured.spec import ToolSpec


class LLM:
    """Runs the engine's step loop in the caller's thread until every request finishes."""

    def __init__(self, model: str | None = None, device: str | None = None, **engine_args: Any) -> None:
        self.engine: LLMEngine = build_engine(EngineArgs(model=model, device=device, **engine_args))
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def generate(
        self,
        prompts: str | Sequence[int] | Sequence[str | Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Prompts are strings (encoded as plain text, no template) or token-id lists."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item,assignment]
        plist = list(params) if isinstance(params, Sequence) else [params or SamplingParams()] * len(prompts)
        order: list[str] = []
        for prompt, p in zip(prompts, plist, strict=True):
            ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)  # type: ignore[arg-type]
            rid = f"llm-{next(self._ids)}"
            if p.structured is not None:
                check(p.structured, p.max_tokens)  # a bad schema raises here, before anything runs
            self.engine.add_request(rid, ids, _copy(p))
            order.append(rid)
        return self._run(order)

    def chat(
        self, messages: list[ChatMessage], params: SamplingParams | None = None,
        reasoning_effort: Effort = "medium", tools: list[FunctionTool] | None = None,
    ) -> tuple[RequestOutput, ParsedOutput]:
        """One harmony conversation: the raw output and its parse (reasoning, answer, tool calls).
        A `params.structured` constraint applies to the answer (and tool calls), not the reasoning;
        a JSON schema is also shown to the model in the developer message."""
        params = _copy(params or SamplingParams())
        told = None
        if params.structured is not None:
            params.structured = replace(params.structured, harmony=True, tools=params.structured.tools or [
                ToolSpec(t.name, t.parameters) for t in tools or []])
            schema = params.structured.json_schema or ({"type": "object"} if params.structured.json_object else None)
            told = ResponseFormat("response", "", schema) if schema is not None else None
        prompt = render_chat(messages, tools=tools, reasoning_effort=reasoning_effort, response_format=told)
        out = self.generate([prompt.token_ids], params)[0]
        return out, parse_completion(out.token_ids)

    def _run(self, order: list[str]) -> list[RequestOutput]:
        prompts = {rid: self.engine.requests[rid].prompt_token_ids for rid in order}
        tokens: dict[str, list[int]] = {rid: [] for rid in order}
        texts: dict[str, list[str]] = {rid: [] for rid in order}
        logprobs: dict[str, list[TokenLogprob]] = {rid: [] for rid in order}
        done: dict[str, RequestOutput] = {}
        while len(done) < len(order):
            for d in self.engine.step():
                tokens[d.request_id].extend(d.new_token_ids)
                texts[d.request_id].append(d.new_text)
                logprobs[d.request_id].extend(d.new_logprobs or [])
                if d.finished:
                    done[d.request_id] = RequestOutput(
                        request_id=d.request_id, prompt_token_ids=prompts[d.request_id],
                        token_ids=tokens[d.request_id], text="".join(texts[d.request_id]),
                        finish_reason=d.finish_reason, stop_reason=d.stop_reason,
                        logprobs=logprobs[d.request_id] or None,
                        num_cached_tokens=d.num_cached_tokens,
                    )
        return [done[rid] for rid in order]


def _copy(p: SamplingParams) -> SamplingParams:
    return replace(p, stop_token_ids=list(p.stop_token_ids), stop=list(p.stop))
