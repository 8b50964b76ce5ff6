"""The shared masks (matchers.py: free-text rows and finished grammars skip llguidance) are exactly
llguidance's own: random walks through the serving grammars over the real harmony vocabulary, a
batch of them stepped together through one Grammars, each row's mask compared every step with a
separate matcher's, fed the same tokens. Each token is drawn from the allowed set, biased toward
the tokens that move the grammar on (special tokens: a channel's end, a header) and toward tokens
that split a character, so the walks reach every kind of state the fast path must recognise or
leave alone: free text on and off a character boundary, a budget's last tokens, preambles, free
final answers, the headers, JSON, finished grammars."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from osserve.structured.free_text import Phase
from osserve.structured.grammar import free_channels, grammar_text
from osserve.structured.matchers import STOPPED, Grammars
from osserve.structured.spec import StructuredOutputs, ToolSpec
from osserve.structured.vocabulary import SPECIAL, harmony_lltokenizer, utf8_shapes
from osserve.tokenizer import load_tokenizer

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["answer", "unit", "steps"],
          "properties": {"answer": {"type": "integer"}, "unit": {"enum": ["km", "mi"]},
                         "steps": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 2}}}
WEATHER = ToolSpec("get_weather", {"type": "object", "additionalProperties": False, "required": ["city"],
                                   "properties": {"city": {"type": "string", "maxLength": 8}}})
TIME = ToolSpec("get_time", {"type": "object", "required": ["tz"], "properties": {"tz": {"enum": ["UTC", "CET"]}}})
STRICT = ToolSpec(WEATHER.name, WEATHER.parameters, strict=True)
# the built-in tools as the Responses API declares them: called in analysis, python's body free text
PYTHON = ToolSpec("python", recipient="python", channel="analysis", free_text=True)
SEARCH = ToolSpec("browser.search", {"type": "object", "required": ["query"],
                                     "properties": {"query": {"type": "string", "maxLength": 8}}},
                  recipient="browser.search", channel="analysis")


def harmony(**kw) -> StructuredOutputs:  # type: ignore[no-untyped-def]
    return StructuredOutputs(harmony=True, **kw)


# (spec, max_tokens): the serving benchmark's answer, forced calls, the grammars with a preamble
# or a free final answer, other answer formats, a raw completion; budgets small enough to be reached.
CASES = [
    (harmony(json_schema=SCHEMA), 24), (harmony(json_schema=SCHEMA), None), (harmony(json_schema=SCHEMA), 64),
    (harmony(tools=[WEATHER, TIME], tool_choice="required"), 24),
    (harmony(tools=[WEATHER, TIME], tool_choice="named", tool_name="get_time"), None),
    (harmony(tools=[STRICT, TIME]), None), (harmony(tools=[STRICT, TIME]), 40), (harmony(tools=[STRICT]), 80),
    (harmony(tools=[STRICT, TIME], json_schema=SCHEMA), None),
    (harmony(tools=[WEATHER], tool_choice="none"), 48),
    (harmony(choice=["yes", "no"]), 16),
    (harmony(grammar='start: "(" NUM ")"\nNUM: /[0-9]{1,4}/'), None),
    (StructuredOutputs(json_object=True), None),
    (harmony(tools=[PYTHON, SEARCH, STRICT]), 40), (harmony(tools=[PYTHON], tool_choice="required"), 30),
]
BATCH = 16
STEPS = 240
CONSTRAINED = 12  # tokens past the free channels, at most, before a walk is replaced by a new request
P_SPECIAL, P_SPLIT = 0.06, 0.08


@dataclass
class Walk:
    case: int
    reference: object  # an LLMatcher of its own, copied from a template compiled apart
    script: list[int]  # a header to write at the first place one may open, where the grammar allows it
    constrained: int = 0  # tokens past the free channels
    scripting: bool = False


class Draw:
    """A random token among those a mask allows, some kinds favoured: the tokens in `favoured` (by
    id) with their probabilities, where the mask allows any."""

    def __init__(self, rng: random.Random, vocab: int, favoured: list[tuple[float, np.ndarray]]) -> None:
        self.rng, self.vocab, self.favoured = rng, vocab, favoured

    def __call__(self, bits: np.ndarray) -> int:
        pick = self.rng.random()
        for p, ids in self.favoured:
            if pick < p:
                ok = ids[(bits[ids >> 5] >> (ids & 31)) & 1 == 1]
                if len(ok):
                    return int(ok[self.rng.randrange(len(ok))])
                break
            pick -= p
        for _ in range(4):  # most masks allow most tokens: try a few before listing them
            t = self.rng.randrange(self.vocab)
            if (bits[t >> 5] >> (t & 31)) & 1:
                return t
        allowed = np.nonzero(np.unpackbits(bits.view(np.uint8), bitorder="little")[: self.vocab])[0]
        return int(allowed[self.rng.randrange(len(allowed))])


@pytest.mark.parametrize(("seed", "lanes"), [(0, 1), (1, 3)])
def test_shared_masks_equal_llguidance_masks_on_random_walks(seed: int, lanes: int) -> None:
    """lanes: the grammars' mask lanes (3: each grammar compiled three times, its requests' rows
    filled from three threads, each lane's by its own)."""
    from llguidance import LLMatcher
    from llguidance.torch import fill_next_token_bitmask

    rng = random.Random(seed)
    vocab = load_tokenizer().vocab_size
    shapes = utf8_shapes()
    lead, tail = np.frombuffer(shapes.lead, np.uint8), np.frombuffer(shapes.tail, np.uint8)
    special = np.nonzero(lead == SPECIAL)[0].astype(np.int64)
    split = np.nonzero((tail > 0) & (lead != SPECIAL))[0].astype(np.int64)  # leave a character open
    draw = Draw(rng, vocab, [(P_SPECIAL, special), (P_SPLIT, split)])
    grammars = Grammars(vocab, lanes=lanes)
    texts = [grammar_text(spec, max_tokens) for spec, max_tokens in CASES]
    templates = [LLMatcher(harmony_lltokenizer(), text, log_level=0) for text in texts]
    enc = load_tokenizer().encoding
    scripts = [[]] + [enc.encode(f"<|channel|>{c}<|message|>", allowed_special="all")  # type: ignore[attr-defined]
                      for c in ("analysis", "commentary", "commentary", "final", "analysis to=python code")]
    walks: dict[str, Walk] = {}
    served: Counter[str] = Counter()  # rows by how their mask came, for the coverage asserts
    lanes_seen: set[int] = set()
    serial = 0

    def begin(case: int) -> None:
        nonlocal serial
        rid = f"w{serial}"
        serial += 1
        spec, max_tokens = CASES[case]
        text = texts[case]
        assert text is not None
        grammars.start(rid, text, free_channels(spec, max_tokens))
        assert grammars.ready(wait=True) == [(rid, None)]
        lanes_seen.add(grammars.states[rid].lane)
        walks[rid] = Walk(case, templates[case].deep_copy(), list(rng.choice(scripts)))

    for i in range(BATCH):
        begin(i % len(CASES))
    next_case = BATCH % len(CASES)
    reference = torch.empty(1, grammars.words, dtype=torch.int32)
    for _ in range(STEPS):
        rids = list(walks)
        for rid in rids:
            state = grammars.states[rid]
            key = state.key
            free = state.free
            if key is not None and key in state.masks:
                served["stopped" if key == STOPPED else "free " + key.decode()] += 1
            elif key is not None:
                served["learnt"] += 1
            elif free is not None and free.phase is Phase.TEXT:  # free text the fast path leaves alone
                served["free text, mid-character" if free.owed else "free text, budget's end"] += 1
            else:
                served["constrained"] += 1
        step = grammars.masks(rids)
        assert step is not None and not step.dead
        slots = {row: slot for slot, row in enumerate(step.rows)}
        sampled = {}
        for row, rid in enumerate(rids):  # in the batch's order: the draws do not depend on the buffer's
            walk = walks[rid]
            fill_next_token_bitmask(walk.reference, reference)  # type: ignore[arg-type]
            assert torch.equal(step.bits[slots[row]], reference[0]), f"{rid}: {CASES[walk.case]}"
            bits = reference[0].numpy()
            free = grammars.states[rid].free
            if walk.script and (walk.scripting or free is not None and free.phase is Phase.TURN):
                t = walk.script.pop(0)
                walk.scripting = bool((bits[t >> 5] >> (t & 31)) & 1)
                if walk.scripting:
                    sampled[rid] = t
                    continue
                walk.script.clear()
            sampled[rid] = draw(bits)
        assert not grammars.accept(sampled)
        for rid, token in sampled.items():
            walk = walks[rid]
            assert walk.reference.consume_token(token)  # type: ignore[attr-defined]
            free = grammars.states[rid].free
            walk.constrained += free is None or free.phase is Phase.OFF
            if walk.constrained > CONSTRAINED or walk.reference.is_stopped() and rng.random() < 0.3:  # type: ignore[attr-defined]
                grammars.drop(rid)
                del walks[rid]
                begin(next_case)
                next_case = (next_case + 1) % len(CASES)
    # Every way a mask is made was exercised, and the shared ones served most free rows.
    for kind in ("free analysis", "free commentary", "free final", "stopped", "learnt", "constrained",
                 "free text, mid-character", "free text, budget's end"):
        assert served[kind] >= 5, (kind, served)
    assert served["free analysis"] > served["learnt"]
    assert lanes_seen == set(range(lanes))


def test_free_channels_are_the_grammars_free_rules_with_their_budgets() -> None:
    """free_channels names exactly the channels harmony_lark leaves free, with the budgets it wrote."""
    import json
    import re

    for spec, max_tokens in CASES:
        text = grammar_text(spec, max_tokens)
        assert text is not None
        free = free_channels(spec, max_tokens)
        if not spec.harmony:
            assert free == {}
            continue
        if text.startswith("{"):  # a client's grammar beside the turn's
            text = json.loads(text)["grammars"][0]["lark_grammar"]
        budgets = dict(re.findall(r"^(analysis|preamble)_text\[max_tokens=(\d+)\]", text, re.M))
        assert free["analysis"] == (int(budgets["analysis"]) if max_tokens is not None else None)
        assert ("commentary" in free) == ("preamble?" in text)
        if "commentary" in free:
            assert free["commentary"] == (int(budgets["preamble"]) if max_tokens is not None else None)
        action = re.search(r"^action: (.*)$", text, re.M)
        assert action is not None
        free_final = "final" in action.group(1).split(" | ") and bool(re.search(r"^final: .* TEXT <\|return\|>$",
                                                                              text, re.M))
        assert ("final" in free) == free_final


@pytest.mark.parametrize("words", [6284, 7, 64])
def test_empty_masks_are_found_wherever_the_allowed_tokens_lie(words: int) -> None:
    """matchers._nonempty looks at each row's first 4,096 tokens, then at the whole of the rows
    where those are clear: a token allowed anywhere counts, an all-clear row is empty."""
    from osserve.structured.matchers import _nonempty

    rows = np.zeros((5, words), dtype=np.int32)
    rows[0, 0] = 1  # the first token
    rows[1, words - 1] = np.int32(-2**31)  # the last bit of the last word only
    rows[2, words // 2] = 4  # the middle
    rows[4, :] = -1  # everything
    assert _nonempty(rows) == [True, True, True, False, True]
