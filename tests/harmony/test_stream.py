"""The stream parser: exact deltas for well-formed output, and no failure on anything else."""

from __future__ import annotations

import random

from osserve.harmony.stream import (
    ContentDelta,
    HarmonyStreamParser,
    ReasoningDelta,
    ToolCallArgsDelta,
    ToolCallStart,
    parse_completion,
)
from osserve.tokenizer import load_tokenizer


def toks(s: str) -> list[int]:
    return load_tokenizer().encoding.encode(s, allowed_special="all")  # type: ignore[attr-defined]


def ids() -> object:
    n = iter(range(100))
    return lambda: f"call_{next(n)}"


def test_reasoning_then_final_deltas() -> None:
    p = HarmonyStreamParser(new_call_id=ids())  # type: ignore[arg-type]
    out = []
    text = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Yes!<|return|>"
    for t in toks(text):
        out += p.push([t])
    assert "".join(d.text for d in out if isinstance(d, ReasoningDelta)) == "Think."
    assert "".join(d.text for d in out if isinstance(d, ContentDelta)) == "Yes!"
    assert p.done and p.parsed.reasoning_tokens == len(toks("Think."))


def test_two_tool_calls_with_preamble() -> None:
    p = HarmonyStreamParser(new_call_id=ids())  # type: ignore[arg-type]
    out = p.push(toks("<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant to=functions.a"
                      "<|channel|>commentary <|constrain|>json<|message|>{}<|end|><|start|>assistant"
                      "<|channel|>commentary to=functions.b<|message|>[1]<|call|>ignored"))
    assert out == [ContentDelta("Let me check."), ToolCallStart(0, "call_0", "a"), ToolCallArgsDelta(0, "{}"),
                   ToolCallStart(1, "call_1", "b"), ToolCallArgsDelta(1, "[1]")]
    assert p.parsed.finish_reason_hint == "tool_calls"


def test_cut_off_and_text_without_header() -> None:
    assert parse_completion(toks("<|channel|>final<|message|>half an ans")).content == "half an ans"
    assert parse_completion(toks("just words")).content == "just words"
    assert parse_completion(toks("<|channel|>analysis<|message|>hmm")).reasoning == "hmm"


def test_fuzz_random_sequences_never_raise_or_leak_special_tokens() -> None:
    tok = load_tokenizer()
    specials = [199999, 200002, 200003, 200005, 200006, 200007, 200008, 200012, 200010, 200018]
    words = toks(" analysis final commentary to=functions.x json hello {} assistant")
    rng = random.Random(0)
    for _ in range(2000):
        seq = [rng.choice(specials) if rng.random() < 0.35 else rng.choice(words + [rng.randrange(199_998)])
               for _ in range(rng.randrange(1, 40))]
        p = HarmonyStreamParser(tok)
        deltas = p.push(seq) + p.finish()
        shown = "".join(getattr(d, "text", "") for d in deltas) + p.parsed.content + p.parsed.reasoning
        assert "<|" not in shown
        assert all(isinstance(d, ContentDelta | ReasoningDelta | ToolCallStart | ToolCallArgsDelta)
                   for d in deltas)


def test_non_harmony_output_streams_as_text_at_once() -> None:
    p = HarmonyStreamParser()
    first = p.push(toks("Hello"))
    assert first == [ContentDelta("Hello")]
    assert p.push(toks(" world")) == [ContentDelta(" world")]
    # A real header is still waited for, token by token.
    q = HarmonyStreamParser()
    assert q.push(toks("<|channel|>")) == [] and q.push(toks("final")) == []
    assert q.push(toks("<|message|>Hi")) == [ContentDelta("Hi")]
