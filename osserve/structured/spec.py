"""What a request's output must follow, as the server and offline users state it: plain data
(picklable, so it crosses to an engine process), no grammar library here.

Two scopes. A raw completion (`harmony=False`) is constrained as a whole. A harmony chat turn
(`harmony=True`) keeps its reasoning free: the `analysis` channel is unconstrained, the `final`
answer follows the answer format, and a tool call's arguments follow that tool's schema
(grammar.py writes the whole turn's grammar).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from osserve.errors import InvalidRequestError

ToolChoiceMode = Literal["auto", "none", "required", "named"]


@dataclass(frozen=True)
class ToolSpec:
    """A declared tool, as the constraint needs it: a function (`functions.NAME`, in commentary,
    JSON arguments), or another harmony recipient: an MCP server's tool (`label.tool`, the same
    form), the built-in browser's functions (`browser.search`, in analysis, `code` content type,
    JSON arguments) or python (`python`, in analysis, its body free code text)."""

    name: str
    parameters: dict[str, Any] | None = None  # JSON schema of the arguments
    strict: bool = False  # arguments follow the schema even where the call is not forced
    recipient: str = ""  # the harmony recipient; "" for a function: functions.NAME
    channel: str = "commentary"  # where the call is made: analysis for the built-in tools
    free_text: bool = False  # the body is text (python's code), not JSON arguments

    @property
    def harmony_recipient(self) -> str:
        return self.recipient or f"functions.{self.name}"


@dataclass
class StructuredOutputs:
    """At most one answer format (json_schema, json_object, regex, choice, grammar), and for a
    harmony turn which tool calls it may or must make."""

    json_schema: dict[str, Any] | None = None
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None  # a Lark grammar in llguidance's dialect
    harmony: bool = False
    tools: list[ToolSpec] = field(default_factory=list)
    tool_choice: ToolChoiceMode = "auto"
    tool_name: str | None = None  # with tool_choice "named"
    closed_tools: bool = False  # no call but to `tools`, even under "auto" (a response past its max_tool_calls)
    answer_param: str = "response_format"  # the request field the answer format came from (errors name it)

    @property
    def answer_formats(self) -> list[str]:
        """The answer formats set, of "json_schema", "json_object", "regex", "choice", "grammar"."""
        given = {"json_schema": self.json_schema is not None, "json_object": self.json_object,
                 "regex": self.regex is not None, "choice": self.choice is not None,
                 "grammar": self.grammar is not None}
        return [name for name, on in given.items() if on]

    @property
    def answer_format(self) -> str | None:
        """The answer format (validate() allows at most one), or None: free text."""
        formats = self.answer_formats
        return formats[0] if formats else None

    @property
    def constrains(self) -> bool:
        """Whether any token of the output is constrained (else no grammar is built at all)."""
        if not self.harmony:
            return self.answer_format is not None
        return (self.answer_format is not None or self.tool_choice != "auto" or self.closed_tools
                or any(t.strict for t in self.tools))

    def validate(self) -> None:
        """Raise InvalidRequestError naming the field for an inconsistent spec (the grammar's own
        validity is grammar.py's check)."""
        formats = self.answer_formats
        if len(formats) > 1:
            raise InvalidRequestError(f"only one output format may be given, got {', '.join(formats)}",
                                      self.answer_param)
        if self.json_schema is not None and not isinstance(self.json_schema, dict):
            raise InvalidRequestError("the JSON schema must be an object", self.answer_param)
        if self.choice is not None and (not self.choice or not all(isinstance(c, str) and c for c in self.choice)):
            raise InvalidRequestError("choice must be a non-empty list of non-empty strings", self.answer_param)
        recipients = [t.harmony_recipient for t in self.tools]
        if len(set(recipients)) != len(recipients):
            raise InvalidRequestError("tool names must be distinct", "tools")
        if self.tool_choice in ("required", "named") and not self.harmony:
            raise InvalidRequestError("tool_choice needs a chat (harmony) request", "tool_choice")
        if self.tool_choice == "required" and not self.tools:
            raise InvalidRequestError("tool_choice 'required' needs at least one tool", "tool_choice")
        if self.tool_choice == "named" and self.tool_name not in [t.name for t in self.tools if not t.recipient]:
            raise InvalidRequestError(f"tool_choice names '{self.tool_name}', which is not in tools", "tool_choice")
