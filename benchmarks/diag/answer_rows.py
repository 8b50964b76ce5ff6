"""Where a random-weight model's json_schema turn spends its rows, and what a grammar process's step
of such rows costs. The serving benchmark's chat request (bench_structured.SCHEMA, max_tokens 256)
is walked through matchers.Grammars, each token drawn uniformly from its step's allowed set (a
random-weight model's logits are noise over the whole vocabulary, so among the allowed tokens none
is much favoured).

Default: a few turns one at a time, each row counted by where the bounded answer's cursor stands
before it: outside the JSON (the harmony header, the reasoning, the stop tokens after it), inside a
number or between values, inside a key, inside a value string with a position mask
(JsonCursor.position_key) or without one. Printed: rows a turn of each, then the turns' text from
the JSON's start, cut short.

--batch B: B such requests stepped together for a whole turn, as a grammar process steps its share
of the batch (64 of 256 with 4 processes; one mask lane here). Printed: the ms a step of
Grammars.masks and of Grammars.accept.

    PYTHONPATH=$PWD python benchmarks/diag/answer_rows.py [--turns 8] [--seed 0] [--batch 64]
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

import numpy as np

from benchmarks.bench_structured import SCHEMA
from osserve.structured.compiling import Prepared
from osserve.structured.json_cursor import JsonCursor
from osserve.structured.matchers import Grammars, StepMasks
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


def draw(step: StepMasks, row: int, vocab_size: int, rng: np.random.Generator) -> int:
    """A token drawn uniformly from the row's allowed set."""
    slot = step.rows.index(row)
    bits = np.unpackbits(step.bits[slot].numpy().view(np.uint8), bitorder="little")[:vocab_size]
    return int(rng.choice(np.flatnonzero(bits)))


def rows_by_place(grammars: Grammars, prepared: Prepared, turns: int, rng: np.random.Generator,
                  vocab_size: int) -> None:
    rows: Counter[str] = Counter()
    texts = []
    for turn in range(turns):
        rid = f"turn{turn}"
        grammars.start(rid, prepared.text, prepared.free, prepared.bounded)
        assert grammars.ready(wait=True) == [(rid, None)]
        tokens = []
        for _ in range(MAX_TOKENS):
            bounded = grammars.states[rid].bounded
            rows[where(bounded.cursor if bounded is not None else None)] += 1
            step = grammars.masks([rid])
            assert step is not None
            token = draw(step, 0, vocab_size, rng)
            tokens.append(token)
            if grammars.accept({rid: token}):
                raise SystemExit("the walk left the grammar")
        grammars.drop(rid)
        text = load_tokenizer().encoding.decode(tokens, errors="replace")  # type: ignore[attr-defined]
        texts.append(text[text.find("{"):][:160] if "{" in text else "(no JSON opened)")
    for kind, count in sorted(rows.items(), key=lambda kv: -kv[1]):
        print(f"{kind:38s} {count / turns:6.1f} rows a turn")
    for text in texts:
        print(repr(text))


def step_cost(grammars: Grammars, prepared: Prepared, batch: int, rng: np.random.Generator, vocab_size: int) -> None:
    rids = [f"r{i}" for i in range(batch)]
    for rid in rids:
        grammars.start(rid, prepared.text, prepared.free, prepared.bounded)
    grammars.ready(wait=True)
    masks_s = accept_s = 0.0
    for _ in range(MAX_TOKENS):
        start = time.perf_counter()
        step = grammars.masks(rids)
        masks_s += time.perf_counter() - start
        assert step is not None
        tokens = {rid: draw(step, row, vocab_size, rng) for row, rid in enumerate(rids)}
        start = time.perf_counter()
        if grammars.accept(tokens):
            raise SystemExit("a walk left the grammar")
        accept_s += time.perf_counter() - start
    print(f"batch {batch}: masks {1e3 * masks_s / MAX_TOKENS:.2f} ms a step, "
          f"accept {1e3 * accept_s / MAX_TOKENS:.2f} ms a step")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=0, help="time steps of this many requests instead")
    args = ap.parse_args()
    vocab_size = load_tokenizer().vocab_size
    grammars = Grammars(vocab_size, lanes=1)
    prepared = grammars.grammar_for(StructuredOutputs(harmony=True, json_schema=SCHEMA), MAX_TOKENS)
    assert prepared is not None
    rng = np.random.default_rng(args.seed)
    if args.batch:
        step_cost(grammars, prepared, args.batch, rng, vocab_size)
    else:
        rows_by_place(grammars, prepared, args.turns, rng, vocab_size)


if __name__ == "__main__":
    main()
