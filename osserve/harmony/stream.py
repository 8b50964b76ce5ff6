"""Model output tokens → typed deltas (reasoning, content, tool calls), for any token sequence.

A small state machine over harmony's framing, written here rather than wrapped around
openai-harmony's StreamableParser because that parser raises on malformed input, and ours must
never fail: a stray token, a cut-off message, a malformed or endless header, an unknown recipient
all degrade to text and the response finishes. Special tokens are never shown as text.

    <|start|>assistant<|channel|>analysis<|message|>...<|end|>          → reasoning
    <|start|>assistant<|channel|>final<|message|>...<|return|>          → content
    <|start|>assistant<|channel|>commentary<|message|>...<|end|>        → content (a preamble)
    <|start|>assistant to=functions.f<|channel|>commentary <|constrain|>json<|message|>{..}<|call|>
                                                                         → tool call f({..})
The prompt ends with `<|start|>assistant`, so parsing starts in the header.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from osserve.tokenizer import (
    CALL,
    END,
    ENDOFTEXT,
    MESSAGE,
    RETURN,
    START,
    IncrementalDecoder,
    Tokenizer,
    load_tokenizer,
)

MAX_HEADER_TOKENS = 48  # a header longer than this is not a header: degrade to text


@dataclass
class ReasoningDelta:
    text: str


@dataclass
class ContentDelta:
    text: str


@dataclass
class ToolCallStart:
    index: int
    id: str
    name: str  # the function's name (the recipient without `functions.`)
    recipient: str = field(default="", compare=False)  # as the model wrote it: functions.f, python, browser.search
    channel: str = field(default="commentary", compare=False)


@dataclass
class ToolCallArgsDelta:
    index: int
    text: str


Delta = ReasoningDelta | ContentDelta | ToolCallStart | ToolCallArgsDelta


@dataclass
class ParsedToolCall:
    id: str
    name: str
    arguments: str
    recipient: str = ""  # the whole recipient: functions.f, python, browser.search, label.tool
    channel: str = "commentary"  # the channel the call was made in


@dataclass
class ParsedOutput:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ParsedToolCall] = field(default_factory=list)
    reasoning_tokens: int = 0  # tokens of analysis-channel message bodies
    ended_with_call: bool = False

    @property
    def finish_reason_hint(self) -> str | None:
        return "tool_calls" if self.tool_calls and self.ended_with_call else None


class _State(Enum):
    EXPECT_START = 1
    HEADER = 2
    CONTENT = 3
    DONE = 4


_RECIPIENT = re.compile(r"to=([^\s<]+)")


def _new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


class HarmonyStreamParser:
    """Feed output token ids with `push`; get deltas back. `parsed` accumulates the whole."""

    def __init__(
        self, tokenizer: Tokenizer | None = None, new_call_id: Callable[[], str] = _new_call_id,
    ) -> None:
        self.tok = tokenizer or load_tokenizer()
        self.new_call_id = new_call_id
        self.state = _State.HEADER
        self.header: list[int] = []
        self.kind: str = "content"  # of the current message: reasoning | content | tool
        self.decoder = IncrementalDecoder(self.tok)
        self.parsed = ParsedOutput()

    @property
    def done(self) -> bool:
        return self.state is _State.DONE

    def push(self, token_ids: list[int]) -> list[Delta]:
        out: list[Delta] = []
        for t in token_ids:
            self._push_one(t, out)
        return _merge(out)

    def finish(self) -> list[Delta]:
        """Output ended (stop token, max_tokens, abort): flush what is pending."""
        out: list[Delta] = []
        if self.state is _State.HEADER and self.header:
            self._header_as_text(out)
        if self.state is _State.CONTENT:
            self._emit(self.decoder.flush(), out)
        self.state = _State.DONE
        return _merge(out)

    # ------------------------------------------------------------------ internals
    def _push_one(self, t: int, out: list[Delta]) -> None:
        if self.state is _State.DONE:
            return  # tokens after a stop token are ignored
        if t in (RETURN, CALL, ENDOFTEXT):
            if self.state is _State.HEADER and self.header:
                self._header_as_text(out)
            if self.state is _State.CONTENT:
                self._emit(self.decoder.flush(), out)
            self.parsed.ended_with_call = t == CALL and self.kind == "tool"
            self.state = _State.DONE
        elif self.state is _State.CONTENT:
            if t in (END, START):
                self._emit(self.decoder.flush(), out)
                self.state = _State.HEADER if t == START else _State.EXPECT_START
                self.header = []
            elif self.tok.is_special(t):
                pass  # a stray special token inside a message: dropped, never shown
            else:
                if self.kind == "reasoning":
                    self.parsed.reasoning_tokens += 1
                self._emit(self.decoder.push([t]), out)
        elif self.state is _State.EXPECT_START:
            if t == START:
                self.state, self.header = _State.HEADER, []
            elif not self.tok.is_special(t):  # text without a header: treat it as the answer
                self._begin("content", out)
                self._emit(self.decoder.push([t]), out)
        else:  # HEADER
            if t == MESSAGE:
                self._open_message(out)
            elif t == START:
                self.header = []
            elif t == END:
                self.header, self.state = [], _State.EXPECT_START
            else:
                self.header.append(t)
                if len(self.header) > MAX_HEADER_TOKENS or not self._header_plausible():
                    self._header_as_text(out)

    def _header_plausible(self) -> bool:
        """Can the tokens so far still begin an assistant header (`[assistant][ to=X]<|channel|>...`)?
        Checked as they arrive, so output that is plainly not harmony (random weights, a model
        ignoring the format) streams as text at once instead of waiting out MAX_HEADER_TOKENS."""
        text = self.tok.decode(self.header).lstrip()
        text = text.removeprefix("assistant").lstrip()
        if not text:
            return True
        return any(text.startswith(p) or p.startswith(text) for p in ("<|channel|>", "to=", "<|constrain|>"))

    def _open_message(self, out: list[Delta]) -> None:
        raw = self.tok.decode(self.header)  # special tokens decode to their own text: <|channel|>
        channel_match = re.search(r"<\|channel\|>\s*([A-Za-z_]+)", raw)
        channel = channel_match.group(1) if channel_match else None
        recipient_match = _RECIPIENT.search(raw)
        recipient = recipient_match.group(1) if recipient_match else None
        if recipient and recipient != "assistant":
            self._begin("tool", out, recipient, channel or "commentary")
        elif channel == "analysis":
            self._begin("reasoning", out)
        else:  # final, a commentary preamble, or an unknown channel: the answer text
            self._begin("content", out)

    def _begin(self, kind: str, out: list[Delta], recipient: str = "", channel: str = "commentary") -> None:
        self.kind, self.state, self.header = kind, _State.CONTENT, []
        self.decoder = IncrementalDecoder(self.tok)
        if kind == "tool":
            call = ParsedToolCall(self.new_call_id(), recipient.removeprefix("functions."), "", recipient, channel)
            self.parsed.tool_calls.append(call)
            out.append(ToolCallStart(len(self.parsed.tool_calls) - 1, call.id, call.name, recipient, channel))

    def _header_as_text(self, out: list[Delta]) -> None:
        """A header that never became one (too long, or output ended inside it): show its
        ordinary tokens as answer text."""
        ordinary = [t for t in self.header if not self.tok.is_special(t)]
        self._begin("content", out)
        self._emit(self.decoder.push(ordinary), out)

    def _emit(self, text: str, out: list[Delta]) -> None:
        if not text:
            return
        if self.kind == "reasoning":
            self.parsed.reasoning += text
            out.append(ReasoningDelta(text))
        elif self.kind == "tool":
            self.parsed.tool_calls[-1].arguments += text
            out.append(ToolCallArgsDelta(len(self.parsed.tool_calls) - 1, text))
        else:
            self.parsed.content += text
            out.append(ContentDelta(text))


def _merge(deltas: list[Delta]) -> list[Delta]:
    """Join adjacent text deltas of the same kind (one step may bring several tokens)."""
    merged: list[Delta] = []
    for d in deltas:
        last = merged[-1] if merged else None
        if isinstance(d, ReasoningDelta | ContentDelta) and type(last) is type(d):
            merged[-1] = type(d)(last.text + d.text)  # type: ignore[union-attr]
        elif isinstance(d, ToolCallArgsDelta) and isinstance(last, ToolCallArgsDelta) and last.index == d.index:
            merged[-1] = ToolCallArgsDelta(d.index, last.text + d.text)
        else:
            merged.append(d)
    return merged


def parse_completion(token_ids: list[int], new_call_id: Callable[[], str] = _new_call_id) -> ParsedOutput:
    """The whole output at once (non-streaming responses)."""
    parser = HarmonyStreamParser(new_call_id=new_call_id)
    parser.push(token_ids)
    parser.finish()
    return parser.parsed
