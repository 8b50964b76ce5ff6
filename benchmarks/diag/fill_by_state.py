"""Which answer rows cost a grammar process its step: one request walks bench_masks' json_schema
turn (reasoning, then the answer) a few times, each position's mask filled alone (matchers.Grammars,
one lane), and the answer's rows are split by where the bounded answer's cursor stands: inside a
value string, inside a key, elsewhere in the JSON, or outside it (harmony's headers, the stop
token). Printed: rows a turn, the median ms a row, the ms a turn of each. Rows inside a value string
take their mask from the fast matcher (no maxLength) at a few schema positions; if they take the
most time, a mask shared by position (as free text's is) is the lever.

    PYTHONPATH=$PWD python benchmarks/diag/fill_by_state.py [--turns 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks.bench_masks import MAX_TOKENS, WORKLOADS, output_tokens
from osserve.structured.matchers import Grammars
from osserve.tokenizer import load_tokenizer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=5)
    args = ap.parse_args()
    grammars = Grammars(load_tokenizer().vocab_size, lanes=1)
    work = WORKLOADS[0]
    tokens, kinds = output_tokens(work)
    prepared = grammars.grammar_for(work.spec, MAX_TOKENS)
    assert prepared is not None
    times: dict[str, list[float]] = {"inside a value string": [], "inside a key": [], "elsewhere in the JSON": [],
                                     "outside the JSON": []}
    for turn in range(args.turns):
        rid = f"turn{turn}"
        grammars.start(rid, prepared.text, prepared.free, prepared.bounded)
        assert grammars.ready(wait=True) == [(rid, None)]
        for token, kind in zip(tokens, kinds, strict=True):
            bounded = grammars.states[rid].bounded
            start = time.perf_counter()
            grammars.masks([rid])
            spent = time.perf_counter() - start
            if kind == "answer":
                cursor = bounded.cursor if bounded is not None else None
                where = ("outside the JSON" if cursor is None or cursor.ended
                         else "elsewhere in the JSON" if not cursor.in_string
                         else "inside a key" if cursor.is_key else "inside a value string")
                times[where].append(spent)
            if grammars.accept({rid: token}):
                raise SystemExit("the walk left the grammar")
        grammars.drop(rid)
    total = sum(sum(v) for v in times.values())
    for where, spent in times.items():
        if spent:
            median = 1e3 * statistics.median(spent)
            print(f"{where:24s} {len(spent) / args.turns:5.1f} rows a turn, median {median:.3f} ms,"
                  f" {1e3 * sum(spent) / args.turns:6.2f} ms a turn ({100 * sum(spent) / total:.0f}%)")


if __name__ == "__main__":
    main()
