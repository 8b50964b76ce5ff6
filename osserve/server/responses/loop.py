"""One response: generate; where the model's turn ends with a call of a tool the server runs
(`python`, `browser.*`, an MCP server's `label.tool`), run it, append its result as the tool's
harmony message, and generate on, until a final answer, a function call (the client's to run), the
output budget or the tool-call limit.

Each step after a tool is a new engine request whose prompt is the previous prompt, the model's
output tokens exactly as sampled, the tool's message and `<|start|>assistant`: the prefix cache
serves all but the new tokens. Over a response:
- `max_output_tokens` bounds the tokens the model writes in all its steps together;
- `max_tool_calls` bounds the tool calls run; past it the output grammar allows no call of the
  server's tools (function calls and the final answer stay possible);
- a forced tool (`tool_choice`) binds the first step only; the steps after a tool's result choose
  freely, as OpenAI's Responses API does;
- a tool that fails, times out or is not declared gives the model its error text, and the response
  goes on; a step the context cannot hold ends the response `incomplete`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

from osserve.engine.core.outputs import CompletionDelta
from osserve.engine.core.sampling_params import SamplingParams
from osserve.errors import InvalidRequestError
from osserve.harmony.render import ChatMessage, ToolCall, tool_result_tokens
from osserve.harmony.stream import (
    ContentDelta,
    HarmonyStreamParser,
    ParsedOutput,
    ReasoningDelta,
    ToolCallArgsDelta,
    ToolCallStart,
)
from osserve.server.generation import ServerState, constrain, generate, new_id
from osserve.server.responses.output import OpenItem, OutputStream
from osserve.server.responses.request_tools import RequestTools
from osserve.structured.spec import StructuredOutputs
from osserve.tools.registry import ConversationTools, ToolResult, call_mcp

log = logging.getLogger(__name__)

ITEM_KIND = {"function": "function_call", "python": "code_interpreter_call", "mcp": "mcp_call"}


@dataclass
class StepSpecs:
    """The output constraint of each step: the first (a forced tool), the ones after a tool's
    result, the ones past max_tool_calls (None: unconstrained)."""

    first: StructuredOutputs | None
    after_tool: StructuredOutputs | None
    past_limit: StructuredOutputs | None


@dataclass
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    def as_dict(self) -> dict[str, Any]:
        # cache_write_tokens (required by OpenAI's schema) is 0: the prefix cache keeps computed blocks as a
        # side effect of serving, and nothing counts them as cache writes.
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "total_tokens": self.input_tokens + self.output_tokens,
                "input_tokens_details": {"cached_tokens": self.cached_tokens, "cache_write_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens}}


@dataclass
class ResponseLoop:
    state: ServerState
    response_id: str
    prompt: list[int]
    params: SamplingParams  # the first step's; max_tokens is the whole response's budget
    specs: StepSpecs
    tools: RequestTools
    conversation: ConversationTools | None
    out: OutputStream
    max_tool_calls: int
    messages: list[ChatMessage] = field(default_factory=list)  # what the assistant did, for the store
    usage: Usage = field(default_factory=Usage)
    last: CompletionDelta | None = None
    cut_short: bool = False  # a step the context could not hold, after a tool's result
    tool_calls: int = 0
    _step: int = 0
    _deltas: AsyncIterator[CompletionDelta] | None = None
    _first: CompletionDelta | None = None
    _calls: dict[str, tuple[str, OpenItem | None]] = field(default_factory=dict)

    async def start(self) -> None:
        """The first step's first delta: a request the engine refuses fails here, before the
        response starts (a 400)."""
        self._deltas = generate(self.state, self.prompt, constrain(self.params, self.specs.first), self.response_id)
        self._first = await anext(self._deltas)

    async def run(self) -> AsyncIterator[None]:
        """Runs the response, yielding whenever the output stream has news."""
        tokens = list(self.prompt)
        while True:
            assert self._deltas is not None and self._first is not None
            parser = HarmonyStreamParser(self.state.tokenizer)
            written: list[int] = []
            step_prompt = len(tokens)
            deltas, first = self._deltas, self._first
            self._deltas = self._first = None
            last = first
            written += first.new_token_ids
            self._feed(parser.push(first.new_token_ids) + (parser.finish() if first.finished else []))
            yield
            async for d in deltas:
                last = d
                written += d.new_token_ids
                self._feed(parser.push(d.new_token_ids) + (parser.finish() if d.finished else []))
                yield
            self.last = last
            self._count(step_prompt, last, parser.parsed)
            call = self._call_to_run(parser.parsed, last)
            if call is None:
                self.out.close("completed" if last.finish_reason == "stop" else "incomplete")
                self.messages.append(_assistant_message(parser.parsed, self._calls))
                return
            written_item = self.out.written_call()
            tool_call, result = await self._run_tool(call, written_item)
            yield
            message = _assistant_message(parser.parsed, self._calls)
            self.messages += [message, ChatMessage("tool", result.text, tool_call_id=tool_call.id)]
            tokens += written + tool_result_tokens(tool_call, result.text)
            if not await self._next_step(tokens):
                return

    # ------------------------------------------------------------------ steps
    async def _next_step(self, tokens: list[int]) -> bool:
        """Starts the step after a tool's result; False where the response must end here."""
        params = _copy_params(self.params)
        if self.params.max_tokens is not None:
            params.max_tokens = self.params.max_tokens - self.usage.output_tokens
        room = self.state.engine.max_model_len - len(tokens)
        if params.max_tokens is not None and params.max_tokens <= 0:
            self.cut_short = True  # the output budget went on the steps before
            return False
        if room <= 1:
            self.cut_short = True
            return False
        if params.max_tokens is not None:
            params.max_tokens = min(params.max_tokens, room)
        spec = self.specs.after_tool if self.tool_calls < self.max_tool_calls else self.specs.past_limit
        self._step += 1
        try:
            self._deltas = generate(self.state, tokens, constrain(params, spec), f"{self.response_id}-{self._step}")
            self._first = await anext(self._deltas)
        except InvalidRequestError as exc:  # the context cannot hold the step: the response ends here
            log.info("response %s ends after a tool's result: %s", self.response_id, exc.message)
            self.cut_short = True
            return False
        return True

    def _count(self, prompt_len: int, last: CompletionDelta, parsed: ParsedOutput) -> None:
        self.usage.input_tokens += prompt_len
        self.usage.output_tokens += last.num_output_tokens
        self.usage.cached_tokens += last.num_cached_tokens
        self.usage.reasoning_tokens += parsed.reasoning_tokens

    def _call_to_run(self, parsed: ParsedOutput, last: CompletionDelta) -> Any:
        """The call that ended the step, where the server runs it (None: the response ends)."""
        if not parsed.ended_with_call or last.finish_reason != "stop" or not parsed.tool_calls:
            return None
        call = parsed.tool_calls[-1]
        route, _ = self._calls.get(call.id, ("function", None))
        return None if route == "function" else call

    # ------------------------------------------------------------------ what the model writes
    def _feed(self, produced: list[Any]) -> None:
        for x in produced:
            if isinstance(x, ReasoningDelta):
                self.out.text("reasoning", x.text)
            elif isinstance(x, ContentDelta):
                self.out.text("message", x.text)
            elif isinstance(x, ToolCallStart):
                self._start_call(x)
            elif isinstance(x, ToolCallArgsDelta):
                self.out.call_text(x.text)

    def _start_call(self, x: ToolCallStart) -> None:
        route = self.tools.route(x.recipient or x.name)
        kind = ITEM_KIND.get(route, "hidden")
        if route == "function":
            self.out.start_call(kind, x.id, name=x.name)
        elif route == "python":
            container = self.conversation.id if self.conversation is not None else "cntr_none"
            self.out.start_call(kind, new_id("ci_"), container_id=container)
        elif route == "mcp":
            label, _, name = x.recipient.partition(".")
            self.out.start_call(kind, new_id("mcp_"), server_label=label, name=name)
        else:
            self.out.start_call(kind, new_id("ws_" if route == "browser" else "call_"))
        self._calls[x.id] = (route, self.out.open)

    # ------------------------------------------------------------------ the tools
    async def _run_tool(self, call: Any, it: OpenItem | None) -> tuple[ToolCall, ToolResult]:
        """Runs the call with its events and item; never raises for what the tool does."""
        route, _ = self._calls[call.id]
        item_id = it.item_id if it is not None else new_id("call_")
        namespace, _, function = call.recipient.partition(".")
        tool_call = ToolCall(item_id, function or call.recipient, call.arguments, recipient=call.recipient,
                             channel=call.channel)
        self.tool_calls += 1
        try:
            if route == "python" and it is not None:
                return tool_call, await self._python(call.arguments, it)
            if route == "browser":
                return tool_call, await self._browser(call.recipient, function, call.arguments, item_id)
            if route == "mcp" and it is not None:
                return tool_call, await self._mcp(namespace, function, call.arguments, it)
        except Exception as exc:  # a tool's failure is the model's to read, never the client's 500
            log.exception("tool call %s failed", call.recipient)
            return tool_call, ToolResult(f"The tool `{call.recipient}` failed: {type(exc).__name__}: {exc}", True)
        note = f"No tool `{call.recipient}` is available here. Answer without it."
        return tool_call, ToolResult(note, is_error=True)

    async def _python(self, code: str, it: OpenItem) -> ToolResult:
        assert self.conversation is not None
        self.out.event("response.code_interpreter_call.interpreting", output_index=it.index, item_id=it.item_id)
        result = await self.conversation.call("python", code)
        self.out.event("response.code_interpreter_call.completed", output_index=it.index, item_id=it.item_id)
        item = dict(self.out.items[it.index], code=code, status="failed" if result.is_error else "completed",
                    outputs=[{"type": "logs", "logs": result.text}])
        self.out.done(it.index, item)
        return result

    async def _browser(self, recipient: str, function: str, arguments: str, item_id: str) -> ToolResult:
        assert self.conversation is not None and self.conversation.browser is not None
        action = self.conversation.browser.action(function, arguments)
        index = self.out.add({"type": "web_search_call", "id": item_id, "status": "in_progress", "action": action})
        self.out.event("response.web_search_call.in_progress", output_index=index, item_id=item_id)
        self.out.event("response.web_search_call.searching", output_index=index, item_id=item_id)
        result = await self.conversation.call(recipient, arguments)
        self.out.event("response.web_search_call.completed", output_index=index, item_id=item_id)
        self.out.done(index, {"type": "web_search_call", "id": item_id, "action": action,
                              "status": "failed" if result.is_error else "completed"})
        return result

    async def _mcp(self, label: str, function: str, arguments: str, it: OpenItem) -> ToolResult:
        server = self.tools.mcp[label]
        result = await call_mcp(server, function, arguments)
        item = dict(self.out.items[it.index], arguments=arguments)
        if result.is_error:
            self.out.event("response.mcp_call.failed", output_index=it.index, item_id=it.item_id)
            item.update(status="failed", output=None, error={
                "type": "mcp_tool_execution_error", "content": [{"type": "text", "text": result.text}]})
        else:
            self.out.event("response.mcp_call.completed", output_index=it.index, item_id=it.item_id)
            item.update(status="completed", output=result.text, error=None)
        self.out.done(it.index, item)
        return result


def _copy_params(params: SamplingParams) -> SamplingParams:
    """The first step's parameters for a later step: lists copied, the grammar set per step."""
    return replace(params, stop=list(params.stop), stop_token_ids=list(params.stop_token_ids), structured=None)


def _assistant_message(parsed: ParsedOutput, calls: dict[str, tuple[str, OpenItem | None]]) -> ChatMessage:
    """One step's output as the stored conversation keeps it: reasoning, text, and its calls (each
    server tool's under its item id, as its result refers to it)."""
    tool_calls = []
    for c in parsed.tool_calls:
        route, it = calls.get(c.id, ("function", None))
        if route == "function":
            tool_calls.append(ToolCall(c.id, c.name, c.arguments))
        else:
            namespace, _, function = c.recipient.partition(".")
            tool_calls.append(ToolCall(it.item_id if it is not None else c.id, function or c.recipient, c.arguments,
                                       recipient=c.recipient, channel=c.channel))
    return ChatMessage("assistant", parsed.content or None, reasoning=parsed.reasoning or None, tool_calls=tool_calls)
