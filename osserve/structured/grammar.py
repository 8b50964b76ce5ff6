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

ANSWER is the answer format (JSON schema, any JSON object, a regex, one of a few strings, a
grammar of the client's) or free text; ARGS_f is f's JSON schema where the call is forced or the
tool is strict, else any JSON object. A forced call comes straight after the reasoning: the
header the model writes is the call's. Where the answer or a call must fit in max_tokens, the
reasoning (with the preamble, which takes a quarter of it) gets at most half of them (at most
REASONING_RESERVE fewer): a required call is never crowded out by endless reasoning (a
random-weight model never ends it by itself).

Whitespace between JSON tokens is at most one space: a model writes JSON compact or spaced
(`{"a": 1, "b": 2}`, as json.dumps does) as it learned, but cannot pad it without end (the free
whitespace of JSON lets a random-weight model, or a looping one, write nothing else).
"""

from __future__ import annotations

import json
from typing import Any

from osserve.errors import InvalidRequestError
from osserve.structured.spec import StructuredOutputs

REASONING_RESERVE = 1024  # tokens kept for the answer or call, at most, out of max_tokens
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
    calls = {t.name: t for t in spec.tools}
    if spec.tool_choice == "named":
        assert spec.tool_name is not None
        callable_ = [spec.tool_name]
    elif spec.tool_choice == "none":
        callable_ = []
    else:
        callable_ = list(calls)
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
    for i, name in enumerate(callable_):
        tool = calls[name]
        schema = tool.parameters if (forced or tool.strict) and tool.parameters else ANY_OBJECT
        body = f'<|constrain|> "json" <|message|> {json_schema(schema)} <|call|>'
        lines.append(f"call_{i}: <|channel|> {_literal(f'commentary to=functions.{name} ')} {body}"
                     f" | {_literal(f' to=functions.{name}')} <|channel|> \"commentary \" {body}")
    return "\n".join([*lines, *budgets, "TEXT: /(?s:.*)/"])


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


def check(spec: StructuredOutputs, max_tokens: int | None = None) -> str | None:
    """The spec's grammar text, checked: InvalidRequestError naming the field when the spec is
    inconsistent or a schema, regex or grammar cannot be compiled. Needs no tokenizer (cheap: the
    server calls it per request)."""
    spec.validate()
    for i, tool in enumerate(spec.tools):
        if tool.parameters is not None and (tool.strict or spec.tool_choice in ("required", "named")):
            _validate(f"start: {json_schema(tool.parameters)}", f"tools[{i}].function.parameters")
    text = grammar_text(spec, max_tokens)
    if text is not None:
        _validate(text, spec.answer_param)
    return text


def _validate(text: str, param: str) -> None:
    from llguidance import LLMatcher

    is_error, messages = LLMatcher.validate_grammar_with_warnings(_as_grammar(text))
    if is_error:
        raise InvalidRequestError(f"the output constraint cannot be compiled: {messages[0]}", param)


def _as_grammar(text: str) -> str:
    """llguidance takes a Lark grammar as its JSON wrapper, or the wrapper itself."""
    from llguidance import LLMatcher

    return text if text.startswith("{") else LLMatcher.grammar_from_lark(text)
