"""The grammars of structured outputs, walked token by token with llguidance's matcher over the
harmony vocabulary (no model): what each spec lets through and what it refuses, and the 400s."""

from __future__ import annotations

import pytest

from osserve.errors import InvalidRequestError
from osserve.structured.grammar import check, grammar_text
from osserve.structured.requests import answer_format, chat_structured, ollama_format, tool_choice_mode
from osserve.structured.spec import StructuredOutputs, ToolSpec
from osserve.structured.vocabulary import harmony_lltokenizer
from osserve.tokenizer import load_tokenizer

SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
          "additionalProperties": False}
WEATHER = ToolSpec("get_weather", {"type": "object", "properties": {"city": {"type": "string"}},
                                   "required": ["city"], "additionalProperties": False})
TIME = ToolSpec("get_time", {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]})
REASON = "<|channel|>analysis<|message|>Let me think.<|end|><|start|>assistant"


def toks(text: str, special: bool = True) -> list[int]:
    """Harmony's special tokens as themselves, or (special=False) every character as plain text."""
    if not special:
        return load_tokenizer().encode(text)
    return load_tokenizer().encoding.encode(text, allowed_special="all")  # type: ignore[attr-defined]


def accepts(spec: StructuredOutputs, tokens: list[int], max_tokens: int | None = None) -> bool:
    """Whether the grammar takes every token, and ends accepting (a stop token closes a turn)."""
    from llguidance import LLMatcher

    text = grammar_text(spec, max_tokens)
    assert text is not None
    m = LLMatcher(harmony_lltokenizer(), text if text.startswith("{") else LLMatcher.grammar_from_lark(text),
                  log_level=0)
    assert not m.is_error(), m.get_error()
    return all(m.consume_token(t) for t in tokens) and (m.is_accepting() or m.is_stopped())


def harmony(**kw) -> StructuredOutputs:  # type: ignore[no-untyped-def]
    return StructuredOutputs(harmony=True, **kw)


def test_final_json_follows_the_schema_and_reasoning_is_free() -> None:
    spec = harmony(json_schema=SCHEMA)
    assert accepts(spec, toks(REASON + '<|channel|>final<|message|>{"answer":82}<|return|>'))
    assert accepts(spec, toks('<|channel|>final<|message|>{"answer":-3}<|return|>'))  # reasoning is optional
    assert not accepts(spec, toks(REASON + '<|channel|>final<|message|>{"answer":"82"}<|return|>'))
    assert not accepts(spec, toks(REASON + "<|channel|>final<|message|>82<|return|>"))
    assert not accepts(spec, toks(REASON + '<|channel|>final<|message|>{"answer":82,"x":1}<|return|>'))
    # An answer format allows no tool call: there are no tools.
    assert not accepts(spec, toks(REASON + '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}'))


def test_special_tokens_are_matched_by_identity_not_by_their_text() -> None:
    spec = harmony(json_schema=SCHEMA)
    spelled = toks("<|channel|>final<|message|>", special=False)  # the same characters, as plain text
    assert len(spelled) > 3 and not accepts(spec, spelled + toks('{"answer":1}<|return|>'))
    assert not accepts(spec, toks(REASON + '<|channel|>final<|message|>{"answer":1}<|end|>'))  # wrong stop


def test_required_and_named_tool_choice() -> None:
    call = '<|channel|>commentary to=functions.{} <|constrain|>json<|message|>{}<|call|>'
    required = harmony(tools=[WEATHER, TIME], tool_choice="required")
    assert accepts(required, toks(REASON + call.format("get_weather", '{"city":"Oslo"}')))
    assert accepts(required, toks(call.format("get_time", '{"tz":"UTC"}')))
    rendered = ' to=functions.get_time<|channel|>commentary <|constrain|>json<|message|>{"tz":"UTC"}<|call|>'
    assert accepts(required, toks(REASON + rendered))  # the recipient where harmony renders it
    assert not accepts(required, toks(REASON + '<|channel|>final<|message|>Hi<|return|>'))  # no call: refused
    assert not accepts(required, toks(call.format("get_weather", '{"town":"Oslo"}')))  # arguments off-schema
    assert not accepts(required, toks(call.format("delete_all", "{}")))  # undeclared tool
    # A forced call comes right after the reasoning: no preamble.
    preamble = "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant"
    assert not accepts(required, toks(preamble + call.format("get_weather", '{"city":"Oslo"}')))
    named = harmony(tools=[WEATHER, TIME], tool_choice="named", tool_name="get_time")
    assert accepts(named, toks(call.format("get_time", '{"tz":"CET"}')))
    assert not accepts(named, toks(call.format("get_weather", '{"city":"Oslo"}')))


def test_none_forbids_tool_headers_and_auto_strict_checks_arguments() -> None:
    call = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{}<|call|>'
    none = harmony(tools=[WEATHER], tool_choice="none")
    assert accepts(none, toks(REASON + "<|channel|>final<|message|>No tools.<|return|>"))
    assert not accepts(none, toks(REASON + call.format('{"city":"Oslo"}')))
    strict = harmony(tools=[ToolSpec(WEATHER.name, WEATHER.parameters, strict=True)])
    assert strict.constrains
    assert accepts(strict, toks(REASON + "<|channel|>final<|message|>Any text.<|return|>"))
    assert accepts(strict, toks(REASON + call.format('{"city":"Oslo"}')))
    assert not accepts(strict, toks(REASON + call.format('{"city":1}')))
    preamble = "<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant"
    assert accepts(strict, toks(REASON + preamble + call.format('{"city":"Oslo"}')))  # may announce a call
    assert not accepts(harmony(json_schema=SCHEMA), toks(preamble + '<|channel|>final<|message|>{"answer":1}'))
    assert not harmony(tools=[WEATHER]).constrains  # auto, not strict: no grammar at all


def test_reasoning_budget_leaves_room_for_the_forced_call() -> None:
    """With max_tokens known, the reasoning is cut at its budget (half of max_tokens at most) and
    the call must follow: a model that would reason forever is made to call the tool in time."""
    from llguidance import LLMatcher

    spec = harmony(tools=[WEATHER], tool_choice="required")
    text = grammar_text(spec, 40)
    assert text is not None and "max_tokens=20" in text
    m = LLMatcher(harmony_lltokenizer(), LLMatcher.grammar_from_lark(text), log_level=0)
    for t in toks("<|channel|>analysis<|message|>"):
        assert m.consume_token(t)
    word = toks(" think", special=False)[0]
    taken = 0
    while m.try_consume_tokens([word]) == 1:  # a refused token leaves the matcher as it was
        taken += 1
        assert taken <= 20
    assert taken == 20 and m.consume_token(toks("<|end|>")[0])


def test_raw_completion_scope_and_other_formats() -> None:
    assert accepts(StructuredOutputs(json_object=True), toks('{"a":[1,2]}<|return|>'))
    assert not accepts(StructuredOutputs(json_object=True), toks("[1,2]<|return|>"))
    assert accepts(StructuredOutputs(regex=r"\d{3}-\d{4}"), toks("555-1234"))
    assert not accepts(StructuredOutputs(regex=r"\d{3}-\d{4}"), toks("55a-1234"))
    assert accepts(StructuredOutputs(choice=["yes", "no"]), toks("no"))
    assert not accepts(StructuredOutputs(choice=["yes", "no"]), toks("maybe"))
    grammar = 'start: "(" NUM ")"\nNUM: /[0-9]+/'
    assert accepts(StructuredOutputs(grammar=grammar), toks("(42)"))
    # The client's grammar inside a harmony turn: the answer only.
    assert accepts(harmony(grammar=grammar), toks(REASON + "<|channel|>final<|message|>(7)<|return|>"))
    assert not accepts(harmony(grammar=grammar), toks(REASON + "<|channel|>final<|message|>7<|return|>"))
    assert grammar_text(StructuredOutputs(), 100) is None


@pytest.mark.parametrize(("spec", "param"), [
    (StructuredOutputs(json_schema={"type": "object", "properties": {"a": {"type": "nonsense"}}}), "response_format"),
    (StructuredOutputs(regex="(unclosed", answer_param="format"), "format"),
    (StructuredOutputs(grammar="start: ???"), "response_format"),
    (StructuredOutputs(json_object=True, regex="x"), "response_format"),
    (StructuredOutputs(choice=[]), "response_format"),
    (harmony(tools=[WEATHER], tool_choice="named", tool_name="nope"), "tool_choice"),
    (harmony(tools=[], tool_choice="required"), "tool_choice"),
    (harmony(tools=[ToolSpec("f", {"type": "bogus"}, strict=True)]), "tools[0].function.parameters"),
    (harmony(tools=[WEATHER, WEATHER]), "tools"),
])
def test_bad_specs_are_400s_naming_the_field(spec: StructuredOutputs, param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        check(spec, 100)
    assert info.value.param == param


def test_api_shapes_become_specs() -> None:
    assert answer_format({"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}},
                         "response_format", nested=True) == {"json_schema": SCHEMA}
    assert answer_format({"type": "json_schema", "name": "x", "schema": SCHEMA}, "text.format",
                         nested=False) == {"json_schema": SCHEMA}
    assert answer_format({"type": "json_object"}, "response_format", True) == {"json_object": True}
    assert answer_format({"type": "text"}, "response_format", True) == {}
    for bad, param in (({"type": "json_schema"}, "response_format.json_schema"),
                       ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema.schema"),
                       ({"type": "xml"}, "response_format.type")):
        with pytest.raises(InvalidRequestError) as info:
            answer_format(bad, "response_format", nested=True)
        assert info.value.param == param
    assert tool_choice_mode({"type": "function", "function": {"name": "f"}}, ["f"]) == ("named", "f")
    assert tool_choice_mode({"type": "function", "name": "f"}, ["f"]) == ("named", "f")
    with pytest.raises(InvalidRequestError):
        tool_choice_mode({"type": "function", "function": {"name": "g"}}, ["f"])
    assert chat_structured(None, "response_format", True, [WEATHER], "auto") is None
    assert ollama_format("json") == {"json_object": True} and ollama_format(SCHEMA) == {"json_schema": SCHEMA}
    with pytest.raises(InvalidRequestError):
        ollama_format("yaml")


PYTHON = ToolSpec("python", recipient="python", channel="analysis", free_text=True)
SEARCH = ToolSpec("browser.search", {"type": "object", "properties": {"query": {"type": "string"}},
                                     "required": ["query"]}, recipient="browser.search", channel="analysis")
MCP_ADD = ToolSpec("calc.add", {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                   recipient="calc.add")


def test_forced_builtin_and_mcp_calls_take_their_own_forms() -> None:
    python = harmony(tools=[PYTHON], tool_choice="required")
    assert accepts(python, toks(REASON + "<|channel|>analysis to=python code<|message|>print(6 * 7)<|call|>"))
    assert accepts(python, toks(" to=python<|channel|>analysis code<|message|>x = 1\nprint(x)<|call|>"))
    assert not accepts(python, toks("<|channel|>analysis to=python code<|message|><|call|>"))  # no code at all
    assert not accepts(python, toks(REASON + "<|channel|>final<|message|>42<|return|>"))  # no call: refused
    assert not accepts(python, toks("<|channel|>commentary to=functions.python <|constrain|>json<|message|>{}"
                                    "<|call|>"))  # a function of that name is another tool
    # A forced built-in tool is "required" over that tool alone (structured/requests.responses_tool_choice).
    search = harmony(tools=[SEARCH], tool_choice="required")
    assert accepts(search, toks('<|channel|>analysis to=browser.search code<|message|>{"query": "mxfp4"}<|call|>'))
    assert not accepts(search, toks('<|channel|>analysis to=browser.search code<|message|>{"q": "x"}<|call|>'))
    assert not accepts(search, toks("<|channel|>analysis to=python code<|message|>1<|call|>"))
    mcp = harmony(tools=[MCP_ADD], tool_choice="required")
    assert accepts(mcp, toks('<|channel|>commentary to=calc.add <|constrain|>json<|message|>{"a": 2}<|call|>'))
    assert not accepts(mcp, toks('<|channel|>commentary to=calc.add <|constrain|>json<|message|>{"a": "2"}'
                                 "<|call|>"))


def test_responses_tool_choice_forces_each_kind_of_tool() -> None:
    from osserve.structured.requests import responses_tool_choice

    fn = ToolSpec("python", {"type": "object"})  # a function that happens to be called python
    tools = [fn, PYTHON, SEARCH, MCP_ADD]
    assert responses_tool_choice({"type": "code_interpreter"}, tools) == ("required", None, [PYTHON])
    assert responses_tool_choice({"type": "web_search_preview"}, tools) == ("required", None, [SEARCH])
    assert responses_tool_choice({"type": "mcp", "server_label": "calc"}, tools) == ("required", None, [MCP_ADD])
    assert responses_tool_choice({"type": "mcp", "server_label": "calc", "name": "add"}, tools)[2] == [MCP_ADD]
    assert responses_tool_choice({"type": "function", "name": "python"}, tools) == ("named", "python", tools)
    assert responses_tool_choice("required", tools) == ("required", None, tools)
    named = harmony(tools=tools, tool_choice="named", tool_name="python")  # the function, not the built-in
    assert accepts(named, toks("<|channel|>commentary to=functions.python <|constrain|>json<|message|>{}<|call|>"))
    assert not accepts(named, toks("<|channel|>analysis to=python code<|message|>1<|call|>"))
    for choice, message in (({"type": "mcp", "server_label": "calc", "name": "sub"}, "MCP server 'calc' with a tool"),
                            ({"type": "code_interpreter"}, "a code_interpreter tool"),
                            ({"type": "file_search"}, "not supported"), ({"type": "mcp"}, "needs server_label")):
        with pytest.raises(InvalidRequestError, match=message):
            responses_tool_choice(choice, [fn] if choice.get("type") == "code_interpreter" else tools)


def test_python_code_is_bounded_so_a_forced_call_ends() -> None:
    from llguidance import LLMatcher

    spec = harmony(tools=[PYTHON], tool_choice="required")
    text = grammar_text(spec, max_tokens=80)
    assert text is not None
    m = LLMatcher(harmony_lltokenizer(), LLMatcher.grammar_from_lark(text), log_level=0)
    assert all(m.consume_token(t) for t in toks("<|channel|>analysis to=python code<|message|>"))
    one_token_code = toks("x", special=False)
    taken = 0
    while m.consume_token(one_token_code[0]):  # the code's budget runs out: then only <|call|> is allowed
        taken += 1
        assert taken < 80
    assert taken >= 10 and m.consume_token(toks("<|call|>")[0]) and (m.is_accepting() or m.is_stopped())
