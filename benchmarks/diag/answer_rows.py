"""Where a random-weight model's json_schema turn spends its rows: the serving benchmark's chat
request (bench_structured.SCHEMA, max_tokens 256) walked a few times through matchers.Grammars, each
token drawn uniformly from its step's allowed set (a random-weight model's logits are noise over the
whole vocabulary, so among the allowed tokens none is much favoured), each row counted by where the
bounded answer's cursor stands before it: outside the JSON (the harmony header, the reasoning, the
stop tokens after it), inside a number or between values, inside a key, inside a value string with
a position mask (JsonCursor.position_key) or without one. Printed: rows a turn of each, then the
turns' text from the JSON's start, cut short.

    PYTHONPATH=$PWD python benchmarks/diag/answer_rows.py [--turns 8] [--seed 0]
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np

from benchmarks.bench_structured import SCHEMA
from osserve.structured.json_cursor import JsonCursor
from osserve.structured.matchers import Grammars
from osserve.structured.spec import StructuredOutputs
from osserve.tokenizer import load_tokenizer

MAX_TOKENS = 256


def where(cursor: JsonCursor | None) -> str:
    if cursor is None or cursor.ended:
        return "outside the JSON"
    if not cursor.in_string:
        return "a number, or between values"
    if cursor.is_key:
        return "inside a key"
    return "inside a value string, position mask" if cursor.position_key() else "inside a value string, filled"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    tokenizer = load_tokenizer()
    grammars = Grammars(tokenizer.vocab_size, lanes=1)
    prepared = grammars.grammar_for(StructuredOutputs(harmony=True, json_schema=SCHEMA), MAX_TOKENS)
    assert prepared is not None
    rng = np.random.default_rng(args.seed)
    rows: Counter[str] = Counter()
    texts = []
    for turn in range(args.turns):
        rid = f"turn{turn}"
        grammars.start(rid, prepared.text, prepared.free, prepared.bounded)
        assert grammars.ready(wait=True) == [(rid, None)]
        tokens = []
        for _ in range(MAX_TOKENS):
            bounded = grammars.states[rid].bounded
            rows[where(bounded.cursor if bounded is not None else None)] += 1
            step = grammars.masks([rid])
            assert step is not None
            bits = np.unpackbits(step.bits[0].numpy().view(np.uint8), bitorder="little")[: tokenizer.vocab_size]
            token = int(rng.choice(np.flatnonzero(bits)))
            tokens.append(token)
            if grammars.accept({rid: token}):
                raise SystemExit("the walk left the grammar")
        grammars.drop(rid)
        text = tokenizer.encoding.decode(tokens, errors="replace")
        texts.append(text[text.find("{"):][:160] if "{" in text else "(no JSON opened)")
    for kind, count in sorted(rows.items(), key=lambda kv: -kv[1]):
        print(f"{kind:38s} {count / args.turns:6.1f} rows a turn")
    for text in texts:
        print(repr(text))


if __name__ == "__main__":
    main()
