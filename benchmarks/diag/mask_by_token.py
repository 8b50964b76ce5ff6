"""What llguidance's mask costs at each token of one JSON answer (CPU, one thread): the answer of
benchmarks/bench_structured.SCHEMA walked token by token through the schema's grammar (without the
harmony turn around it), each mask timed on the second pass (the first builds the lexer's states).

    PYTHONPATH=$PWD python benchmarks/diag/mask_by_token.py [--no-max-length]

--no-max-length drops the `steps` items' maxLength (40) from the schema: the difference is what a
string's length bound costs (2026-11-26, llguidance 1.9.1, this CPU: 8.4 ms for the 50-token answer
against 0.57 ms without it; inside the bounded strings 250 us a token, 1.4-1.7 ms within ten
characters of the bound).
"""

from __future__ import annotations

import argparse
import copy
import time

import llguidance.torch as llt
from llguidance import LLMatcher

from benchmarks.bench_structured import SCHEMA
from osserve.structured.grammar import grammar_text
from osserve.structured.spec import StructuredOutputs
from osserve.structured.vocabulary import harmony_lltokenizer
from osserve.tokenizer import load_tokenizer

ANSWER = ('{"answer": 465, "unit": "km", "confidence": 0.85, "steps": ["Paris to Lyon by the A6 is about 465 km", '
          '"allow for where one starts", "answer in km"]}')


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-max-length", action="store_true")
    args = ap.parse_args()
    schema = copy.deepcopy(SCHEMA)
    if args.no_max_length:
        del schema["properties"]["steps"]["items"]["maxLength"]
    grammar = grammar_text(StructuredOutputs(json_schema=schema), None)
    assert grammar is not None
    lltok = harmony_lltokenizer()
    text = grammar if grammar.startswith("{") else LLMatcher.grammar_from_lark(grammar)
    template = LLMatcher(lltok, text, log_level=0)
    ids = load_tokenizer().encode(ANSWER)
    bitmask = llt.allocate_token_bitmask(1, lltok.vocab_size)
    for _ in range(2):  # the second pass is timed: the first builds the lexer's states
        matcher, times = template.deep_copy(), []
        for t in ids:
            start = time.perf_counter()
            llt.fill_next_token_bitmask(matcher, bitmask, 0)
            times.append((time.perf_counter() - start) * 1e6)
            assert matcher.consume_token(t), matcher.get_error()
    for t, us in zip(ids, times, strict=True):
        print(f"{us:9.1f} us  {load_tokenizer().decode([t])!r}")
    print(f"{sum(times) / 1e3:.2f} ms for {len(ids)} tokens (maxLength {'dropped' if args.no_max_length else 'kept'})")


if __name__ == "__main__":
    main()
