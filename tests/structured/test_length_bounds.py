"""String maxLengths enforced beside the grammar (length_bounds.py, json_cursor.py): which schemas
qualify, what the cursor counts, and above all that the masks are exactly llguidance's own for the
schema with its bounds: random walks through bounded schemas over the real harmony vocabulary, a
batch stepped together through one Grammars, each row's mask compared every step with a separate
matcher of the bounded grammar. The draws favour quotes, backslashes and split characters, so the
walks write escapes, multi-byte characters, strings at their bound and tokens that close one
string and open the next, and rows inside value strings take their position's shared mask."""

from __future__ import annotations

import json
import random
from collections import Counter

import numpy as np
import pytest
import torch

from osserve.structured.grammar import bounded_answer, free_channels, grammar_text
from osserve.structured.json_cursor import POSITION, JsonCursor, _runs, vocabulary_runs
from osserve.structured.length_bounds import split, stripped_bound
from osserve.structured.matchers import Grammars
from osserve.structured.spec import StructuredOutputs
from osserve.structured.vocabulary import SPECIAL, harmony_lltokenizer, token_bytes, utf8_shapes
from osserve.tokenizer import load_tokenizer
from tests.structured.test_free_masks import Draw

BENCH = {"type": "object", "additionalProperties": False, "required": ["answer", "unit", "confidence", "steps"],
         "properties": {"answer": {"type": "integer"}, "unit": {"enum": ["km", "mi", "m"]},
                        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                        "steps": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 3}}}
TIGHT = {"type": "object", "required": ["code", "tags"], "additionalProperties": False,
         "properties": {"code": {"type": "string", "maxLength": 3},
                        "tags": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 5},
                                 "minItems": 2, "maxItems": 4},
                        "note": {"type": ["string", "null"], "maxLength": 7}}}
NESTED = {"$defs": {"city": {"type": "object", "required": ["name"], "additionalProperties": False,
                             "properties": {"name": {"type": "string", "maxLength": 6},
                                            "alias": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 4}}}},
          "type": "object", "required": ["from", "to", "legs"], "additionalProperties": False,
          "properties": {"from": {"$ref": "#/$defs/city"}, "to": {"$ref": "#/$defs/city"},
                         "legs": {"type": "array", "prefixItems": [{"type": "string", "maxLength": 2}],
                                  "items": {"type": "integer"}, "maxItems": 3}}}
MAPPING = {"type": "object", "additionalProperties": {"type": "string", "maxLength": 4}, "maxProperties": 3}
ROOT = {"type": "string", "maxLength": 9}


def harmony(schema: dict) -> StructuredOutputs:
    return StructuredOutputs(json_schema=schema, harmony=True)


def test_split_takes_out_plain_string_bounds_only() -> None:
    bounds = split(NESTED)
    assert bounds is not None and bounds.smallest == 2
    city = bounds.unbounded["$defs"]["city"]["properties"]
    assert "maxLength" not in city["name"] and city["alias"]["maxLength"] == 4  # a pattern keeps its bound
    assert "maxLength" not in bounds.unbounded["properties"]["legs"]["prefixItems"][0]
    assert NESTED["$defs"]["city"]["properties"]["name"]["maxLength"] == 6  # the request's schema untouched
    assert split(BENCH) is not None and split(BENCH).smallest == 40  # type: ignore[union-attr]
    assert stripped_bound({"type": ["string", "null"], "maxLength": 7}) == 7
    assert stripped_bound({"type": "string", "maxLength": 7, "enum": ["a"]}) is None
    assert stripped_bound({"maxLength": 7}) is None  # not declared a string: left to the grammar


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "integer"}]}}},
    {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}}, "patternProperties": {"^x": {}}},
    {"type": "object", "properties": {"a": {"$ref": "#/$defs/s", "maxLength": 3}}, "$defs": {"s": {"type": "string"}}},
    {"type": "object", "properties": {"a": {"$ref": "https://example.com/s.json"}}},
    {"type": "object", "properties": {"a": {"type": "string"}}},  # no bound to take out
])
def test_split_leaves_schemas_the_cursor_cannot_follow_or_need_not(schema: dict) -> None:
    assert split(schema) is None
    assert bounded_answer(harmony(schema), 64) is None


def cursor_after(schema: dict, text: str) -> JsonCursor:
    bounds = split(schema)
    assert bounds is not None
    cursor = JsonCursor(bounds)
    cursor.feed(text.encode())
    return cursor


def test_cursor_counts_characters_as_the_decoded_string_has_them() -> None:
    assert cursor_after(TIGHT, '{"code": "ab').remaining == 1
    assert cursor_after(TIGHT, '{"code": "\\n\\u00e9').remaining == 1  # two escapes: two characters
    assert cursor_after(TIGHT, '{"code": "é€').remaining == 1  # multi-byte: one each
    assert cursor_after(TIGHT, '{"code": "\\u00').escape == 2  # inside an escape: not a boundary
    assert cursor_after(TIGHT, '{"code": "abc", "tags": ["x", "yz').remaining == 3
    assert cursor_after(TIGHT, '{"code": "abc", "tags": ["x"], "note": "a').remaining == 6
    assert cursor_after(TIGHT, '{"co\\u0064e": "a').remaining == 2  # an escaped key is still "code"
    assert cursor_after(NESTED, '{"from": {"name": "Par').remaining == 3
    assert cursor_after(NESTED, '{"from": {"name": "P"}, "to": {"alias": "ab').remaining is None  # in the grammar
    assert cursor_after(NESTED, '{"from": {"name": "P"}, "to": {"name": "L"}, "legs": ["a').remaining == 1
    assert cursor_after(MAPPING, '{"any key": "abc').remaining == 1
    assert cursor_after(ROOT, '"abcdef').remaining == 3
    done = cursor_after(ROOT, '"abc"')
    assert done.ended and not done.in_string
    over = cursor_after(TIGHT, '{"code": "abcd')
    assert over.overflow


def test_feed_token_leaves_the_cursor_as_the_byte_loop_does() -> None:
    """feed_token skips the byte loop for text inside a value string and for bytes between values
    that open or close nothing; over random token sequences (favouring quotes, braces, escapes and
    digits) both ways give the same cursor at every step."""
    rng = random.Random(5)
    runs = vocabulary_runs()
    vocab = token_bytes()
    tricky = [t for t, data in enumerate(vocab) if data and any(b in b'"{}[],\\' for b in data) and len(data) < 6]
    texty = [t for t, data in enumerate(vocab) if data and data.isascii() and data.strip().isalnum()]
    fast_paths = 0
    for schema in (BENCH, TIGHT, NESTED, MAPPING):
        bounds = split(schema)
        assert bounds is not None
        for _ in range(40):
            slow, fast = JsonCursor(bounds), JsonCursor(bounds)
            for _ in range(30):
                t = rng.choice(tricky) if rng.random() < 0.4 else rng.choice(texty)
                skips = (fast.in_string and runs.plain_chars[t] >= 0 and not fast.escape and not fast.is_key) or (
                    not fast.in_string and runs.inert[t])
                fast_paths += skips
                slow.feed(vocab[t])
                fast.feed_token(t, runs)
                assert fast == slow, (schema, vocab[t])
    assert fast_paths > 1000  # both shortcuts were taken, often


def test_token_runs_read_quotes_escapes_and_characters() -> None:
    assert _runs(b'abc", "de', inside=True) == (3, 2)
    assert _runs(b'a\\"b"', inside=True) == (3, 0)  # the escaped quote is one character of the run
    assert _runs(b'\\u00e9x', inside=True) == (2, 0)
    assert _runs(b'": "abcd', inside=True) == (0, 4)  # closes a key, opens its value
    assert _runs(b' "abcd', inside=False) == (0, 4)
    assert _runs('é"'.encode(), inside=True) == (1, 0)
    runs = vocabulary_runs()
    assert runs.first_masks.shape == (int(runs.first.max()), (len(token_bytes()) + 31) // 32)


# (spec, max_tokens): harmony answers after free reasoning (budgets that end it soon) or straight
# away, and raw completions whose whole output is the JSON.
CASES = [(harmony(BENCH), 24), (harmony(TIGHT), None), (harmony(NESTED), 20), (harmony(MAPPING), None),
         (StructuredOutputs(json_schema=TIGHT), None), (StructuredOutputs(json_schema=ROOT), None),
         (StructuredOutputs(json_schema=NESTED), None), (harmony(ROOT), 16)]
BATCH = 12
STEPS = 260
CONSTRAINED = 60  # tokens into an answer, at most, before a walk is replaced by a new request


@pytest.mark.parametrize(("seed", "lanes"), [(0, 1), (1, 2)])
def test_bounded_masks_equal_llguidance_masks_with_the_bounds(seed: int, lanes: int) -> None:
    """lanes 2: each request's fast matcher comes from its own lane, as its main matcher does."""
    from llguidance import LLMatcher
    from llguidance.torch import fill_next_token_bitmask

    rng = random.Random(seed)
    vocab = load_tokenizer().vocab_size
    data = token_bytes()
    lead = np.frombuffer(utf8_shapes().lead, np.uint8)
    tail = np.frombuffer(utf8_shapes().tail, np.uint8)
    special = np.nonzero(lead == SPECIAL)[0].astype(np.int64)
    quotes = np.array([t for t, b in enumerate(data) if b'"' in b], dtype=np.int64)
    escapes = np.array([t for t, b in enumerate(data) if b"\\" in b], dtype=np.int64)
    split_chars = np.nonzero((tail > 0) & (lead != SPECIAL))[0].astype(np.int64)
    draw = Draw(rng, vocab, [(0.04, special), (0.12, quotes), (0.08, escapes), (0.06, split_chars)])
    grammars = Grammars(vocab, lanes=lanes)
    texts = [grammar_text(spec, max_tokens) for spec, max_tokens in CASES]
    templates = [LLMatcher(harmony_lltokenizer(), text, log_level=0) for text in texts]
    final = load_tokenizer().encoding.encode("<|channel|>final<|message|>", allowed_special="all")  # type: ignore[attr-defined]
    walks: dict[str, tuple[int, object, list[int]]] = {}
    seen: Counter[str] = Counter()
    serial = 0

    def begin(case: int) -> None:
        nonlocal serial
        rid = f"w{serial}"
        serial += 1
        spec, max_tokens = CASES[case]
        answer = bounded_answer(spec, max_tokens)
        assert answer is not None
        grammars.start(rid, texts[case], free_channels(spec, max_tokens), answer)  # type: ignore[arg-type]
        assert grammars.ready(wait=True) == [(rid, None)]
        script = list(final) if spec.harmony and rng.random() < 0.6 else []  # else reason first
        walks[rid] = (case, templates[case].deep_copy(), script)

    for i in range(BATCH):
        begin(i % len(CASES))
    next_case = BATCH % len(CASES)
    reference = torch.empty(1, grammars.words, dtype=torch.int32)
    answered: Counter[str] = Counter()
    for _ in range(STEPS):
        rids = list(walks)
        for rid in rids:
            bounded = grammars.states[rid].bounded  # None once the answer is complete
            cursor = bounded.cursor if bounded is not None else None
            if cursor is not None and cursor.escape:
                seen["escape"] += 1
            elif cursor is not None and cursor.remaining is not None:
                seen["near the bound" if cursor.remaining < 3 else "in a bounded string"] += 1
            key = grammars.states[rid].key
            if key is not None and key.startswith(POSITION) and key in grammars.states[rid].masks:
                seen["a position's shared mask"] += 1  # JsonCursor.position_key: not llguidance's fill
        step = grammars.masks(rids)
        assert step is not None and not step.dead
        slots = {row: slot for slot, row in enumerate(step.rows)}
        sampled = {}
        for row, rid in enumerate(rids):
            case, ref, script = walks[rid]
            fill_next_token_bitmask(ref, reference)  # type: ignore[arg-type]
            assert torch.equal(step.bits[slots[row]], reference[0]), f"{rid}: {CASES[case]}"
            bits = reference[0].numpy()
            if script and (bits[script[0] >> 5] >> (script[0] & 31)) & 1:
                sampled[rid] = script.pop(0)
                continue
            script.clear()
            sampled[rid] = draw(bits)
        assert not grammars.accept(sampled)
        for rid, token in sampled.items():
            case, ref, _ = walks[rid]
            assert ref.consume_token(token)  # type: ignore[attr-defined]
            bounded = grammars.states[rid].bounded
            if bounded is None or bounded.cursor is not None:
                answered[rid] += 1
            if answered[rid] > CONSTRAINED or ref.is_stopped() and rng.random() < 0.5:  # type: ignore[attr-defined]
                seen["ended" if ref.is_stopped() else "cut"] += 1  # type: ignore[attr-defined]
                grammars.drop(rid)
                del walks[rid]
                begin(next_case)
                next_case = (next_case + 1) % len(CASES)
    for kind in ("escape", "near the bound", "in a bounded string", "ended", "a position's shared mask"):
        assert seen[kind] >= 5, (kind, seen)


def test_the_engine_passes_the_bounds_and_answers_stay_valid() -> None:
    """A JSON-schema request through the engine's grammars: every answer parses and keeps its bounds."""
    import jsonschema

    from osserve.structured.grammar import check

    rng = random.Random(3)
    vocab = load_tokenizer().vocab_size
    grammars = Grammars(vocab)
    draw = Draw(rng, vocab, [])
    for n in range(6):
        spec = StructuredOutputs(json_schema=TIGHT)
        text = check(spec)
        assert text is not None
        grammars.start(f"r{n}", text, {}, bounded_answer(spec, None))
        grammars.ready(wait=True)
        out: list[int] = []
        for _ in range(200):
            step = grammars.masks([f"r{n}"])
            assert step is not None and not step.dead
            t = draw(step.bits[0].numpy())
            if grammars.states[f"r{n}"].matcher.is_stopped():
                break
            out.append(t)
            assert not grammars.accept({f"r{n}": t})
        answer = json.loads(b"".join(token_bytes()[t] for t in out).decode())
        jsonschema.validate(answer, TIGHT)


def test_a_grammars_lanes_are_compiled_as_its_requests_first_need_them() -> None:
    """Request n of a grammar copies lane n mod lanes, its fast matcher too; a lane is compiled
    once, when its first request comes (the first request of a schema waits for one compile)."""
    from osserve.structured.grammar import check

    grammars = Grammars(load_tokenizer().vocab_size, lanes=3)
    spec = StructuredOutputs(json_schema=TIGHT)
    text = check(spec)
    assert text is not None
    answer = bounded_answer(spec, None)
    assert answer is not None

    def compiled_lanes() -> list[int]:
        return [sum(m is not None for m in grammars.compiler._cache[g].lanes) for g in (text, answer.grammar)]

    lanes, fast_templates = [], set()
    for n in range(5):
        grammars.start(f"r{n}", text, {}, answer)
        assert grammars.ready(wait=True) == [(f"r{n}", None)]
        state = grammars.states[f"r{n}"]
        lanes.append(state.lane)
        assert state.bounded is not None
        if n == 0:
            assert compiled_lanes() == [1, 1]
        fast_templates.add(id(grammars.compiler._cache[answer.grammar].lanes[state.lane]))
    assert lanes == [0, 1, 2, 0, 1]
    assert compiled_lanes() == [3, 3]
    assert len(fast_templates) == 3


def test_a_grammar_slow_to_compile_keeps_one_lane(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the first compile took longer than SLOW_COMPILE_S, the next requests copy it instead of
    each waiting for a lane of their own."""
    from osserve.structured import compiling
    from osserve.structured.grammar import check

    monkeypatch.setattr(compiling, "SLOW_COMPILE_S", 0.0)
    grammars = Grammars(load_tokenizer().vocab_size, lanes=3)
    spec = StructuredOutputs(json_schema=TIGHT)
    text = check(spec)
    assert text is not None
    answer = bounded_answer(spec, None)
    for n in range(4):
        grammars.start(f"r{n}", text, {}, answer)
        assert grammars.ready(wait=True) == [(f"r{n}", None)]
        assert grammars.states[f"r{n}"].lane == 0
    assert answer is not None
    assert [len(grammars.compiler._cache[g].lanes) for g in (text, answer.grammar)] == [1, 1]


def test_a_request_whose_lane_is_compiled_is_ready_at_once() -> None:
    """Once its lane (and its bounded answer's) is compiled, a request's copies are made in start():
    `ready` hands it over without waiting for the compile worker."""
    from osserve.structured.grammar import check

    grammars = Grammars(load_tokenizer().vocab_size, lanes=2)
    spec = StructuredOutputs(json_schema=TIGHT)
    text = check(spec)
    assert text is not None
    answer = bounded_answer(spec, None)
    for n in range(2):  # lanes 0 and 1: compiled by the worker
        grammars.start(f"c{n}", text, {}, answer)
        assert grammars.ready(wait=True) == [(f"c{n}", None)]
    grammars.compiler._compiler.shutdown(wait=True)  # from here a submit to the worker would raise
    for n in range(4):  # every lane compiled: copied in start()
        grammars.start(f"r{n}", text, {}, answer)
        assert grammars.ready() == [(f"r{n}", None)]
        state = grammars.states[f"r{n}"]
        assert state.lane == n % 2 and state.bounded is not None


def test_a_specs_grammar_is_worked_out_once_for_its_requests() -> None:
    """grammar_for remembers each (spec, max_tokens): equal specs of new requests get the same
    text, free channels and bounded answer without working them out again."""
    from osserve.structured.grammar import free_channels, grammar_text

    grammars = Grammars(load_tokenizer().vocab_size, lanes=1)
    spec = StructuredOutputs(json_schema=TIGHT, harmony=True)
    first = grammars.grammar_for(spec, 64)
    assert first is not None and first.bounded is not None
    assert first.text == grammar_text(spec, 64) and first.free == free_channels(spec, 64)
    again = grammars.grammar_for(StructuredOutputs(json_schema=json.loads(json.dumps(TIGHT)), harmony=True), 64)
    assert again is first
    other = grammars.grammar_for(spec, 128)
    assert other is not first and other is not None and other.free != first.free
    assert grammars.grammar_for(StructuredOutputs(harmony=True), 64) is None  # nothing constrained


def test_a_fast_matcher_that_rejects_leaves_its_row_to_the_bounded_grammar() -> None:
    """The fast matcher is fed in its lane's thread: where it rejects a token (its grammar takes
    more than the bounded one, so only a fault can make it), the row's mask comes from the bounded
    grammar, fed what it had yet to see, and the request goes on with it alone. The fault is made
    here by feeding the fast matcher a token no JSON takes, out of turn."""
    from llguidance import LLMatcher
    from llguidance.torch import fill_next_token_bitmask

    from osserve.structured.grammar import check
    from osserve.tokenizer import CHANNEL

    vocab = load_tokenizer().vocab_size
    grammars = Grammars(vocab, lanes=1)
    spec = StructuredOutputs(json_schema=TIGHT)  # a raw completion: the answer from the first token
    text = check(spec)
    assert text is not None
    grammars.start("r", text, {}, bounded_answer(spec, None))
    assert grammars.ready(wait=True) == [("r", None)]
    reference = LLMatcher(harmony_lltokenizer(), LLMatcher.grammar_from_lark(text), log_level=0)
    expected = torch.empty(1, grammars.words, dtype=torch.int32)
    tokens = load_tokenizer().encoding.encode('{"code":"ab","tags":["x","yz"]}', allowed_special=set())
    state = grammars.states["r"]
    for i, token in enumerate(tokens):
        if i == 3:
            assert state.bounded is not None
            assert not state.bounded.fast.consume_token(CHANNEL)  # the fault
        step = grammars.masks(["r"])
        assert step is not None and not step.dead
        fill_next_token_bitmask(reference, expected)
        assert torch.equal(step.bits[0], expected[0]), i
        assert (state.bounded is None) == (i >= 3)
        assert not grammars.accept({"r": token})
        assert reference.consume_token(token)
    assert state.matcher.is_accepting()


def test_a_grammar_keeps_at_most_its_share_of_position_masks() -> None:
    """Rows inside value strings share their position's mask (JsonCursor.position_key), each kept
    with the compiled grammar: at most POSITION_MASKS of them, past which the fast matcher fills
    those rows as before, and every mask is still llguidance's own."""
    from llguidance import LLMatcher
    from llguidance.torch import fill_next_token_bitmask

    from osserve.structured.grammar import check
    from osserve.structured.matchers import POSITION_MASKS

    names = [f"p{i}" for i in range(POSITION_MASKS + 4)]
    schema = {"type": "object", "additionalProperties": False, "required": names,
              "properties": {name: {"type": "string", "maxLength": 6} for name in names}}
    spec = StructuredOutputs(json_schema=schema)  # a raw completion: the answer from the first token
    text = check(spec)
    assert text is not None
    grammars = Grammars(load_tokenizer().vocab_size, lanes=1)
    reference = LLMatcher(harmony_lltokenizer(), LLMatcher.grammar_from_lark(text), log_level=0)
    expected = torch.empty(1, grammars.words, dtype=torch.int32)
    tokens = load_tokenizer().encoding.encode(json.dumps(dict.fromkeys(names, "abcdef")), allowed_special=set())
    shared = 0
    for rid in ("first", "second"):  # the second meets the positions the first learnt
        grammars.start(rid, text, {}, bounded_answer(spec, None))
        assert grammars.ready(wait=True) == [(rid, None)]
        ref = reference.deep_copy()
        state = grammars.states[rid]
        for token in tokens:
            shared += state.key is not None and state.key in state.masks
            step = grammars.masks([rid])
            assert step is not None and not step.dead
            fill_next_token_bitmask(ref, expected)
            assert torch.equal(step.bits[0], expected[0])
            assert not grammars.accept({rid: token}) and ref.consume_token(token)
        grammars.drop(rid)
    assert sum(k.startswith(POSITION) for k in state.masks) == POSITION_MASKS
    assert shared >= POSITION_MASKS
