"""Rendering chat inputs with openai-harmony, and the conversation round trip."""

from __future__ import annotations

from openai_harmony import Conversation, Message, RenderConversationConfig, Role

from osserve.harmony.render import (
    RENDER_CONFIG,
    ChatMessage,
    FunctionTool,
    ResponseFormat,
    ToolCall,
    _render_head,
    harmony_messages,
    render_chat,
)
from osserve.tokenizer import load_tokenizer


def text(ids: list[int]) -> str:
    return load_tokenizer().decode(ids)


def test_round_trip_through_render_conversation_for_completion() -> None:
    enc = load_tokenizer().encoding
    convo = Conversation.from_messages([
        Message.from_role_and_content(Role.USER, "What is 2+2?"),
        Message.from_role_and_content(Role.ASSISTANT, "Simple.").with_channel("analysis"),
        Message.from_role_and_content(Role.ASSISTANT, "4").with_channel("final"),
    ])
    ids = enc.render_conversation(convo, RenderConversationConfig(auto_drop_analysis=False))
    parsed = enc.parse_messages_from_completion_tokens(ids)
    assert [(m.author.role, m.channel, m.content[0].text) for m in parsed] == [
        (Role.USER, None, "What is 2+2?"), (Role.ASSISTANT, "analysis", "Simple."), (Role.ASSISTANT, "final", "4")]
    prompt = enc.render_conversation_for_completion(convo, Role.ASSISTANT)
    assert text(prompt).endswith("<|start|>assistant")


def test_system_developer_tools_and_effort() -> None:
    r = render_chat([ChatMessage("system", "Be brief."), ChatMessage("user", "hi")],
                    tools=[FunctionTool("get_weather", "Weather now", {"type": "object", "properties": {}})],
                    reasoning_effort="high")
    t = text(r.token_ids)
    assert "Reasoning: high" in t and "# Instructions\n\nBe brief." in t
    assert "type get_weather" in t and t.endswith("<|start|>assistant")


def test_history_rules() -> None:
    calls = [ToolCall("c1", "f", '{"a": 1}')]
    r = render_chat([
        ChatMessage("user", "one"), ChatMessage("assistant", "final one", reasoning="THOUGHT-1"),
        ChatMessage("user", "two"), ChatMessage("assistant", None, reasoning="THOUGHT-2", tool_calls=calls),
        ChatMessage("tool", "result", tool_call_id="c1"),
    ], tools=[FunctionTool("f")])
    t = text(r.token_ids)
    assert "THOUGHT-1" not in t and "THOUGHT-2" in t
    assert '<|start|>assistant to=functions.f<|channel|>commentary <|constrain|>json<|message|>{"a": 1}' in t
    assert "<|start|>functions.f to=assistant<|channel|>commentary<|message|>result<|end|>" in t
    assert "final one<|end|>" in t  # a stored <|return|> becomes <|end|>


def test_forced_tool_choice_adds_nothing_to_the_prompt_and_none_hides_the_tools() -> None:
    """The grammar forces the call (structured/grammar.py): the prompt is the auto one."""
    msgs = [ChatMessage("user", "hi")]
    tools = [FunctionTool("a"), FunctionTool("get_weather")]
    auto = render_chat(msgs, tools=tools).token_ids
    assert render_chat(msgs, tools=tools, tool_choice="required").token_ids == auto
    assert render_chat(msgs, tools=tools, tool_choice={"type": "function", "function": {"name": "a"}}).token_ids == auto
    assert "get_weather" not in text(render_chat(msgs, tools=tools, tool_choice="none").token_ids)


def test_a_response_format_is_stated_in_the_developer_message() -> None:
    schema = {"type": "object", "properties": {"sum": {"type": "integer"}}}
    r = render_chat([ChatMessage("system", "Be brief."), ChatMessage("user", "1+1?")],
                    response_format=ResponseFormat("answer", "The sum.", schema))
    t = text(r.token_ids)
    assert ('# Instructions\n\nBe brief.\n\n# Response Formats\n\n## answer\n\n// The sum.\n'
            '{"type":"object","properties":{"sum":{"type":"integer"}}}<|end|>') in t


def test_the_leading_messages_rendered_once_are_the_whole_renderings_start() -> None:
    """render_chat renders the system and developer messages alone (and once: _render_head's
    cache); with the rest rendered after them, the tokens must be the whole conversation's."""
    enc = load_tokenizer().encoding
    calls = [ToolCall("c1", "f", '{"a": 1}')]
    weather = FunctionTool("get_weather", "Weather now", {"type": "object", "properties": {"city": {"type": "string"}}})
    chats = [
        ([ChatMessage("user", "Explain quantum mechanics in one paragraph.")], [], "medium"),
        ([ChatMessage("system", "Be brief."), ChatMessage("user", "hi")], [], "low"),
        ([ChatMessage("developer", "Answer in French."), ChatMessage("user", "hi")], [weather], "high"),
        ([ChatMessage("user", "one"), ChatMessage("assistant", "final one", reasoning="THOUGHT-1"),
          ChatMessage("user", "two"), ChatMessage("assistant", None, reasoning="THOUGHT-2", tool_calls=calls),
          ChatMessage("tool", "result", tool_call_id="c1")], [FunctionTool("f"), weather], "medium"),
        ([ChatMessage("system", "S."), ChatMessage("user", "q"), ChatMessage("assistant", "a")], [], "medium"),
    ]
    for messages, tools, effort in chats:
        convo, head = harmony_messages(messages, tools, effort)
        whole = enc.render_conversation_for_completion(Conversation.from_messages(convo), Role.ASSISTANT,
                                                       RENDER_CONFIG)
        assert render_chat(messages, tools=tools, reasoning_effort=effort).token_ids == whole
    hits = _render_head.cache_info().hits
    render_chat(*chats[0][:1])
    assert _render_head.cache_info().hits == hits + 1
