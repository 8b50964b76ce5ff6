"""Chat inputs → harmony prompt tokens, through openai-harmony's renderer.

The server maps its pydantic requests onto these plain dataclasses. Rules (DESIGN.md §4):
system + developer messages become harmony's developer instructions (the harmony system message
carries the reasoning effort and the channel rules); function tools are declared in the
developer message; an assistant turn's reasoning goes to `analysis`, its content to `final`, its
tool calls to `commentary` with recipient `functions.NAME`; tool results come back from
`functions.NAME` to the assistant. The built-in tools (`browser`, `python`) are declared in the
system message and called in `analysis` (`to=python code`), other tool namespaces (MCP servers) in
the developer message beside `functions`; a call's result comes back from its recipient, in the
call's channel. Earlier analysis is dropped once a final answer follows it,
but kept since the last final when the last assistant action was a tool call (harmony's
auto_drop_analysis does exactly this).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    Message,
    ReasoningEffort,
    RenderConversationConfig,
    Role,
    SystemContent,
    ToolDescription,
    ToolNamespaceConfig,
)

from osserve.errors import InvalidRequestError
from osserve.tokenizer import load_tokenizer

Effort = Literal["low", "medium", "high"]


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as the model wrote it (python's code for the python tool)
    recipient: str | None = None  # the harmony recipient when not `functions.NAME` (python, browser.search, mcp.tool)
    channel: str = "commentary"  # where the model made the call: built-in tools are called in analysis

    @property
    def harmony_recipient(self) -> str:
        return self.recipient or f"functions.{self.name}"


@dataclass
class ChatMessage:
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None  # a tool message's function name, when the client gives it


@dataclass
class FunctionTool:
    name: str
    description: str = ""
    parameters: dict[str, Any] | None = None


ToolChoice = str | dict[str, Any]  # OpenAI's: "auto" | "none" | "required" | a function


@dataclass
class ResponseFormat:
    """A JSON answer format, told to the model in the developer message's "# Response Formats"
    (harmony's place for it); structured/ makes the answer follow it."""

    name: str
    description: str
    schema: dict[str, Any]


@dataclass
class RenderedPrompt:
    token_ids: list[int]  # the prompt, ending with `<|start|>assistant`: the model writes the header


def _system_message(effort: Effort, builtin_tools: list[ToolNamespaceConfig]) -> Message:
    """harmony's system message: the reasoning effort, and the built-in tools gpt-oss was trained
    to find there (browser, python)."""
    content = SystemContent.new().with_reasoning_effort(ReasoningEffort(effort.capitalize()))
    for namespace in builtin_tools:
        content = content.with_tools(namespace)
    return Message.from_role_and_content(Role.SYSTEM, content)


def _response_format_text(fmt: ResponseFormat) -> str:
    """The section harmony's format gives a structured answer (the gpt-oss harmony guide)."""
    comment = f"// {fmt.description}\n" if fmt.description else ""
    return f"# Response Formats\n\n## {fmt.name}\n\n{comment}{json.dumps(fmt.schema, separators=(',', ':'))}"


def _developer_message(instructions: list[str], tools: list[FunctionTool],
                       response_format: ResponseFormat | None = None,
                       namespaces: list[ToolNamespaceConfig] | None = None) -> Message | None:
    if response_format is not None:
        instructions = [*instructions, _response_format_text(response_format)]
    if not instructions and not tools and not namespaces:
        return None
    content = DeveloperContent.new()
    if instructions:
        content = content.with_instructions("\n\n".join(instructions))
    if tools:
        content = content.with_function_tools(
            [ToolDescription.new(t.name, t.description, parameters=t.parameters) for t in tools]
        )
    for namespace in namespaces or []:
        content = content.with_tools(namespace)
    return Message.from_role_and_content(Role.DEVELOPER, content)


def assistant_messages(m: ChatMessage) -> list[Message]:
    """One assistant turn as harmony messages: analysis, then final text or commentary + calls."""
    out: list[Message] = []
    if m.reasoning:
        out.append(Message.from_role_and_content(Role.ASSISTANT, m.reasoning).with_channel("analysis"))
    if m.content:
        channel = "commentary" if m.tool_calls else "final"  # text beside calls is a preamble
        out.append(Message.from_role_and_content(Role.ASSISTANT, m.content).with_channel(channel))
    for call in m.tool_calls:
        out.append(
            Message.from_role_and_content(Role.ASSISTANT, call.arguments)
            .with_channel(call.channel)
            .with_recipient(call.harmony_recipient)
            # The built-in tools' calls are `code` (gpt-oss writes `to=python code`), the others JSON.
            .with_content_type("code" if call.channel == "analysis" else "<|constrain|>json")
        )
    return out


@dataclass
class ToolNamespaces:
    """Tool namespaces beside the function tools: the built-in ones (browser, python) go in the
    system message, the others (MCP servers) in the developer message."""

    builtin: list[ToolNamespaceConfig] = field(default_factory=list)
    developer: list[ToolNamespaceConfig] = field(default_factory=list)


def harmony_messages(messages: list[ChatMessage], tools: list[FunctionTool], reasoning_effort: Effort,
                     response_format: ResponseFormat | None = None,
                     namespaces: ToolNamespaces | None = None) -> tuple[list[Message], int]:
    """The chat as harmony messages, and how many of them lead it (the system message and the
    developer's, if any: their tokens are rendered once, _render_head)."""
    namespaces = namespaces or ToolNamespaces()
    instructions = [m.content for m in messages if m.role in ("system", "developer") and m.content]
    convo: list[Message] = [_system_message(reasoning_effort, namespaces.builtin)]
    dev = _developer_message(instructions, tools, response_format, namespaces.developer)
    if dev is not None:
        convo.append(dev)
    calls: dict[str, ToolCall] = {}
    for m in messages:
        if m.role in ("system", "developer"):
            continue
        if m.role == "user":
            convo.append(Message.from_role_and_content(Role.USER, m.content or ""))
        elif m.role == "assistant":
            calls.update({c.id: c for c in m.tool_calls})
            convo.extend(assistant_messages(m))
        elif m.role == "tool":
            call = calls.get(m.tool_call_id or "")
            if call is None and m.name is None:
                raise InvalidRequestError(
                    f"tool message refers to tool_call_id {m.tool_call_id!r}, which no earlier "
                    "assistant message made", "messages",
                )
            author = call.harmony_recipient if call is not None else f"functions.{m.name}"
            convo.append(
                Message.from_author_and_content(Author.new(Role.TOOL, author), m.content or "")
                .with_channel(call.channel if call is not None else "commentary")
                .with_recipient("assistant")
            )
        else:
            raise InvalidRequestError(f"unknown message role {m.role!r}", "messages")
    head = 1 if dev is None else 2
    return convo[:head] + _drop_analysis_before_last_final(convo[head:]), head


def render_chat(
    messages: list[ChatMessage],
    *,
    tools: list[FunctionTool] | None = None,
    tool_choice: ToolChoice = "auto",
    reasoning_effort: Effort = "medium",
    response_format: ResponseFormat | None = None,
    namespaces: ToolNamespaces | None = None,
) -> RenderedPrompt:
    """The prompt tokens for the assistant's next turn. A forced or forbidden tool call is the
    output grammar's to enforce (structured/grammar.py): the prompt only leaves out the tools of
    tool_choice "none", as vLLM does (the model is not told of tools it may not call)."""
    tools = [] if tool_choice == "none" else list(tools or [])
    if tool_choice == "none":
        namespaces = None
    convo, head = harmony_messages(messages, tools, reasoning_effort, response_format, namespaces)
    enc = load_tokenizer().encoding
    ids = list(_render_head(Conversation.from_messages(convo[:head]).to_json()))
    ids += enc.render_conversation_for_completion(  # type: ignore[attr-defined]
        Conversation.from_messages(convo[head:]), Role.ASSISTANT, RENDER_CONFIG
    )
    return RenderedPrompt(token_ids=ids)


RENDER_CONFIG = RenderConversationConfig(auto_drop_analysis=False)


@functools.lru_cache(maxsize=64)
def _render_head(head_json: str) -> tuple[int, ...]:
    """The system (and developer) messages' tokens, by their JSON: the same for most requests
    (effort, instructions, tools), rendered once. The renderer takes about as long for them as for
    the rest of a one-line chat (~80 µs each on the development machine; the whole rendering took
    0.61 ms a request on the H100 host, under cProfile), and a serving wave's 256 arrivals wait for
    it in turn on the HTTP process's one thread. Rendered alone, they are the tokens the whole
    conversation's rendering starts with (tests/harmony/test_render.py checks it)."""
    enc = load_tokenizer().encoding
    return tuple(enc.render_conversation(Conversation.from_json(head_json), RENDER_CONFIG))  # type: ignore[attr-defined]


def _drop_analysis_before_last_final(convo: list[Message]) -> list[Message]:
    """Earlier chains of thought go once a final answer follows them; the chain since the last
    final (a tool-calling turn in progress) stays. Stated here rather than left to the
    renderer's auto_drop_analysis, which keeps old analysis when a later turn calls a tool."""
    finals = [i for i, m in enumerate(convo) if m.author.role == Role.ASSISTANT and m.channel == "final"]
    if not finals:
        return convo
    last = finals[-1]
    return [m for i, m in enumerate(convo) if not (i < last and m.channel == "analysis")]


def tool_result_tokens(call: ToolCall, text: str) -> list[int]:
    """A tool's result as harmony renders it after the call (from the call's recipient, in its
    channel), then `<|start|>assistant`: what the model reads before it goes on."""
    result = (Message.from_author_and_content(Author.new(Role.TOOL, call.harmony_recipient), text)
              .with_channel(call.channel).with_recipient("assistant"))
    enc = load_tokenizer().encoding
    return list(enc.render_conversation_for_completion(  # type: ignore[attr-defined]
        Conversation.from_messages([result]), Role.ASSISTANT, RENDER_CONFIG))


def tool_arguments_json(arguments: str | dict[str, Any]) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments)
