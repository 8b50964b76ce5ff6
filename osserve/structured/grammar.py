"""A request's constraint as one Lark grammar (llguidance's dialect), and its check.

For a harmony turn the grammar spans everything the model writes after the prompt's
`<|start|>assistant`, with harmony's special tokens addressed by identity (`<|channel|>` is token
200005 and nothing else: plain text that spells it does not match), so the structure cannot be
faked by text:

    start:   analysis? preamble? action   (a preamble only where a call is possible, not forced)
    analysis: <|channel|>"analysis"<|message|> TEXT <|end|><|start|>"assistant"    (free)
    preamble: <|channel|>"commentary"<|message|> TEXT <|end|><|start|>"assistant"  (free)
    action:  final | call_f | call_g ...   as tool_choice allows:
             auto: final or any call; none: final; required: any call; named: that call
    final:   <|channel|>"final"<|message|> ANSWER <|return|>
    call_f:  <|channel|>"commentary to=functions.f "<|constrain|>"json"<|message|> ARGS_f <|call|>
           | " to=functions.f"<|channel|>"commentary "<|constrain|>"json"<|message|> ARGS_f <|call|>
             (the recipient after the channel, as the harmony guide writes a call, or before it, as
             harmony renders past calls: a model trained on both may write either)
    call_b:  <|channel|>"analysis to=browser.search code"<|message|> ARGS_b <|call|> | ...
    call_p:  <|channel|>"analysis to=python code"<|message|> CODE <|call|> | ...
             (the built-in tools, called in analysis with the `code` content type, as gpt-oss
             writes them; an MCP server's tool `label.tool` takes a function's form)

ANSWER is the answer format (JSON schema, any JSON object, a regex, one of a few strings, a
grammar of the client's) or free text; ARGS_f is f's JSON schema where the call is forced or the
tool is strict, else any JSON object. A forced call comes straight after the reasoning: the
header the model writes is the call's. Where the answer or a call must fit in max_tokens, the
reasoning (with the preamble, which takes a quarter of it) gets at most half of them (at most
REASONING_RESERVE fewer): a required call is never crowded out by endless reasoning (a
random-weight model never ends it by itself).

python's CODE is free text, as gpt-oss writes it: any ordinary tokens (no special token can
forge a header or an end), at least one, and at most CODE_MAX_TOKENS (or what max_tokens leaves
after the reasoning's share), so a forced call always ends with `<|call|>` and runs. Nothing checks
that it is valid Python (no grammar of Python's indentation fits a Lark grammar): the sandbox runs
it and the model reads the error if it is not.

Whitespace between JSON tokens is at most one space: a model writes JSON compact or spaced
(`{"a": 1, "b": 2}`, as json.dumps does) as it learned, but cannot pad it without end (the free
whitespace of JSON lets a random-weight model, or a looping one, write nothing else).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, replace
from typing import Any

from osserve.errors import InvalidRequestError
from osserve.structured import length_bounds
from osserve.structured.length_bounds import LengthBounds
from osserve.structured.spec import StructuredOutputs, ToolSpec

REASONING_RESERVE = 1024  # tokens kept for the answer or call, at most, out of max_tokens
CODE_MAX_TOKENS = 1024  # python's code in one call, at most
CALL_HEADER_TOKENS = 16  # a call's header and end, kept out of the code's share of max_tokens
JSON_OPTIONS = {"whitespace_pattern": r"\x20?"}
ANY_OBJECT: dict[str, Any] = {"type": "object"}


def json_schema(schema: dict[str, Any]) -> str:
    """`%json {...}` for the schema, its whitespace bounded: its own x-guidance options win where it has any."""
    options = {**JSON_OPTIONS, **schema.get("x-guidance", {})}
    return "%json " + json.dumps({**schema, "x-guidance": options})


def _literal(text: str) -> str:
    return json.dumps(text)  # a Lark string literal: JSON's escapes are Lark's


def answer_rule(spec: StructuredOutputs) -> str:
    """The body of the answer: the format's expression, or free text."""
    fmt = spec.answer_format
    if fmt == "json_schema":
        assert spec.json_schema is not None
        return json_schema(spec.json_schema)
    if fmt == "json_object":
        return json_schema(ANY_OBJECT)
    if fmt == "regex":
        assert spec.regex is not None
        return "/" + spec.regex.replace("/", "\\/") + "/"
    if fmt == "choice":
        assert spec.choice is not None
        return "(" + " | ".join(_literal(c) for c in spec.choice) + ")"
    if fmt == "grammar":
        return "@answer"  # the client's grammar, a grammar of its own (see grammar_text)
    return "TEXT"


def harmony_lark(spec: StructuredOutputs, max_tokens: int | None) -> str:
    """The whole turn's grammar (see the module docstring)."""
    if spec.tool_choice == "named":
        callable_ = [t for t in spec.tools if t.name == spec.tool_name and not t.recipient][:1]
    elif spec.tool_choice == "none":
        callable_ = []
    else:
        callable_ = list(spec.tools)
    forced = spec.tool_choice in ("required", "named")
    preamble = _has_preamble(spec)
    actions = ([] if forced else ["final"]) + [f"call_{i}" for i in range(len(callable_))]
    analysis_text = preamble_text = "TEXT"
    budgets = []
    if max_tokens is not None:
        analysis_budget, preamble_budget = _reasoning_budgets(spec, max_tokens)
        analysis_text, preamble_text = "analysis_text", "preamble_text"
        budgets = [f"analysis_text[max_tokens={analysis_budget}]: /(?s:.*)/",
                   f"preamble_text[max_tokens={preamble_budget}]: /(?s:.*)/"]
    lines = [
        "start: analysis? preamble? action" if preamble else "start: analysis? action",
        f'analysis: <|channel|> "analysis" <|message|> {analysis_text} <|end|> <|start|> "assistant"',
        f'preamble: <|channel|> "commentary" <|message|> {preamble_text} <|end|> <|start|> "assistant"',
        "action: " + " | ".join(actions),
        f'final: <|channel|> "final" <|message|> {answer_rule(spec)} <|return|>',
    ]
    code_budget = CODE_MAX_TOKENS
    if max_tokens is not None:
        reasoning = analysis_budget + preamble_budget
        code_budget = max(1, min(CODE_MAX_TOKENS, max_tokens - reasoning - CALL_HEADER_TOKENS))
    for i, tool in enumerate(callable_):
        lines.extend(call_rules(f"call_{i}", tool, forced, code_budget))
    return "\n".join([*lines, *budgets, "TEXT: /(?s:.*)/"])


def call_rules(rule: str, tool: ToolSpec, forced: bool, code_budget: int) -> list[str]:
    """The rules of one tool's call: its header (the recipient after the channel, or before it),
    its body, <|call|>."""
    recipient = tool.harmony_recipient
    if tool.free_text:
        body_rule = [f"{rule}_code[max_tokens={code_budget}]: /(?s:.+)/"]
        body = f"{rule}_code"
    else:
        schema = tool.parameters if (forced or tool.strict) and tool.parameters else ANY_OBJECT
        body_rule, body = [], json_schema(schema)
    if tool.channel == "analysis":  # the built-in tools: `analysis to=python code`
        message = f"<|message|> {body} <|call|>"
        after = f"<|channel|> {_literal(f'analysis to={recipient} code')} {message}"
        before = f"{_literal(f' to={recipient}')} <|channel|> \"analysis code\" {message}"
    else:
        message = f'<|constrain|> "json" <|message|> {body} <|call|>'
        after = f"<|channel|> {_literal(f'commentary to={recipient} ')} {message}"
        before = f"{_literal(f' to={recipient}')} <|channel|> \"commentary \" {message}"
    return [f"{rule}: {after} | {before}", *body_rule]


def _has_preamble(spec: StructuredOutputs) -> bool:
    """A preamble announces a call the model may choose: where a call is possible, not forced."""
    return spec.tool_choice == "auto" and bool(spec.tools)


def _reasoning_budgets(spec: StructuredOutputs, max_tokens: int) -> tuple[int, int]:
    """The analysis' and the preamble's token budgets: the reasoning's share of max_tokens, the
    preamble's a quarter of it where the grammar has one."""
    budget = max(0, max_tokens - min(REASONING_RESERVE, (max_tokens + 1) // 2))
    short = budget // 4 if _has_preamble(spec) else 0
    return budget - short, short


def free_channels(spec: StructuredOutputs, max_tokens: int | None) -> dict[str, int | None]:
    """The channels of a harmony turn whose text harmony_lark leaves free (any text up to the
    channel's closing token), each with its token budget (None: unbounded): the analysis, the
    preamble where the grammar has one, and the final answer where it has no format. Empty for a
    raw completion. structured/matchers.py gives such text a precomputed mask."""
    if not spec.constrains or not spec.harmony:
        return {}
    analysis, preamble = _reasoning_budgets(spec, max_tokens) if max_tokens is not None else (None, None)
    free: dict[str, int | None] = {"analysis": analysis}
    if _has_preamble(spec):
        free["commentary"] = preamble
    if spec.answer_format is None and spec.tool_choice not in ("required", "named"):
        free["final"] = None
    return free


def grammar_text(spec: StructuredOutputs, max_tokens: int | None) -> str | None:
    """What llguidance compiles for the spec (a grammar, or None where nothing is constrained):
    a Lark grammar, or with a client grammar inside a harmony turn, the JSON of both grammars."""
    if not spec.constrains:
        return None
    if not spec.harmony:
        fmt = spec.answer_format
        if fmt == "grammar":
            assert spec.grammar is not None
            return spec.grammar
        return f"start: {answer_rule(spec)}\nTEXT: /(?s:.*)/"
    main = harmony_lark(spec, max_tokens)
    if spec.answer_format != "grammar":
        return main
    return json.dumps({"grammars": [{"lark_grammar": main}, {"name": "answer", "lark_grammar": spec.grammar}]})


@dataclass(frozen=True)
class BoundedAnswer:
    """A JSON-schema answer's string bounds taken out of the grammar (length_bounds.py): the
    grammar without them, the bounds, and whether the answer is a harmony turn's final message
    (else the whole output)."""

    grammar: str
    bounds: LengthBounds
    harmony: bool


def bounded_answer(spec: StructuredOutputs, max_tokens: int | None) -> BoundedAnswer | None:
    """The spec's BoundedAnswer, or None: no JSON-schema answer, or none of its bounds can be taken
    out (tool calls' arguments keep theirs in the grammar)."""
    if spec.answer_format != "json_schema" or spec.json_schema is None:
        return None
    bounds = length_bounds.split(spec.json_schema)
    if bounds is None:
        return None
    text = grammar_text(replace(spec, json_schema=bounds.unbounded), max_tokens)
    return BoundedAnswer(text, bounds, spec.harmony) if text is not None else None


def check(spec: StructuredOutputs, max_tokens: int | None = None) -> str | None:
    """The spec's grammar text, checked: InvalidRequestError naming the field when the spec is
    inconsistent or a schema, regex or grammar cannot be compiled. Needs no tokenizer (cheap: the
    server calls it per request)."""
    spec.validate()
    for i, tool in enumerate(spec.tools):
        if tool.recipient:  # a server's tool (built-in, MCP): its schema was checked when it was listed
            continue
        if tool.parameters is not None and (tool.strict or spec.tool_choice in ("required", "named")):
            _validate(f"start: {json_schema(tool.parameters)}", f"tools[{i}].function.parameters")
    text = grammar_text(spec, max_tokens)
    if text is not None:
        _validate(text, spec.answer_param)
    return text


def _validate(text: str, param: str) -> None:
    error = _compile_error(text)
    if error is not None:
        raise InvalidRequestError(f"the output constraint cannot be compiled: {error}", param)


@functools.lru_cache(maxsize=256)
def _compile_error(text: str) -> str | None:
    """llguidance's first error for a grammar, or None: remembered, since a server meets the same
    few schemas over and over (each check took ~2 ms of an HTTP process's event loop at c=256)."""
    from llguidance import LLMatcher

    is_error, messages = LLMatcher.validate_grammar_with_warnings(_as_grammar(text))
    return str(messages[0]) if is_error else None


def schema_compiles(schema: dict[str, Any]) -> bool:
    """Whether a JSON schema compiles to a grammar (an MCP server's tool schema may use what
    llguidance does not support: its calls then take any JSON object, and the server checks)."""
    try:
        _validate(f"start: {json_schema(schema)}", "parameters")
    except InvalidRequestError:
        return False
    return True


def _as_grammar(text: str) -> str:
    """llguidance takes a Lark grammar as its JSON wrapper, or the wrapper itself."""
    from llguidance import LLMatcher

    return text if text.startswith("{") else LLMatcher.grammar_from_lark(text)
