"""The host's cost of structured outputs' token masks, on the CPU: B constrained requests (B = 1,
32, 256) walk a realistic harmony output in step, and each step's `Grammars.masks` (the engine's
call: llguidance's masks over the ~201k-token harmony vocabulary) and `Grammars.accept` are timed.

    PYTHONPATH=$PWD python benchmarks/bench_masks.py [--batches 1 32 256] [--rounds 3] [--out FILE]
        [--modes llguidance shared]   (every row's mask from llguidance / Grammars' shared masks)

Workloads (the grammars of the serving benchmark, `benchmarks/structured_ab.sh`, and of forced tool
calls), each a harmony turn of max_tokens 256 (the reasoning's budget: 128 tokens):
- json_schema: the answer follows bench_structured.SCHEMA.
- required / named: a forced call of one of two declared tools (get_weather's schema).
Every request writes the same output: an English reasoning that runs to its budget (as a
random-weight model's does in the serving benchmark), the final JSON answer or the call, then its
stop token again until 256 tokens (`ignore_eos`, as served). Row i of B starts i*256/B tokens
into it, so a step's batch holds every phase in the proportions of steady serving; a request that
ends is replaced by a new one (its grammar from the cache, not timed).

Each step times masks() for the whole batch and, on a twin of the batch (llguidance keeps a
state's mask once computed, so asking one matcher twice would time a lookup), for each kind of row
alone: `analysis` (the reasoning's text, up to its `<|end|>`), `answer` (the headers after it and
the JSON answer or call, up to its stop token) and `stopped` (the stop token repeated after the
grammar ended); and accept() of the step's tokens. Reported: the median ms a step over `--steps`
steps (default 256: a request's whole life) and the median us a row, each the median over
`--rounds` rounds, the modes' rounds alternating. Host-only figures: the serving host fills masks with MASK_THREADS
(osserve/structured/matchers.py) threads, 2 (1 on a host of 2-3 cores); this script uses the same rule.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_structured import SCHEMA  # noqa: E402
from osserve.structured import matchers  # noqa: E402
from osserve.structured.compiling import Prepared  # noqa: E402
from osserve.structured.matchers import Grammars  # noqa: E402
from osserve.structured.spec import StructuredOutputs, ToolSpec  # noqa: E402
from osserve.tokenizer import load_tokenizer  # noqa: E402

MAX_TOKENS = 256
WEATHER = ToolSpec("get_weather", {
    "type": "object", "additionalProperties": False, "required": ["city", "unit"],
    "properties": {"city": {"type": "string", "maxLength": 60}, "unit": {"enum": ["celsius", "fahrenheit"]}}})
TIME = ToolSpec("get_time", {"type": "object", "required": ["tz"], "properties": {"tz": {"type": "string"}}})
REASONING = (
    "The user asks how far it is from Paris to Lyon by road and wants the answer in kilometres, "
    "as JSON with the fields answer, unit, confidence and steps. Paris to Lyon along the A6 "
    "motorway is about 465 km; the straight-line distance is closer to 392 km, but the question "
    "says by road, so the driving distance is what counts. Let me double-check: Paris to Dijon "
    "is roughly 315 km, and Dijon to Lyon about 190 km, which gives around 505 km through Dijon, "
    "a detour; the direct A6 route passes Auxerre and Beaune and measures about 463 to 466 km "
    "depending on where in each city one starts. So 465 km is a fair answer. Confidence: fairly "
    "high, maybe 0.85, since exact figures vary by start and end point. Steps: state the route, "
    "give the distance, note the uncertainty. The schema wants an integer answer, the unit as km, "
    "a number between 0 and 1, and at most three short strings. Now write it.")
ANSWER = {"answer": 465, "unit": "km", "confidence": 0.85,
          "steps": ["Route: A6 motorway via Auxerre", "About 465 km by road", "Varies by start point"]}
CALL_ARGS = {"city": "Lyon", "unit": "celsius"}


@dataclass
class Workload:
    name: str
    spec: StructuredOutputs
    tail: str  # what follows the reasoning, in harmony's text (special tokens by name)


WORKLOADS = [
    Workload("json_schema", StructuredOutputs(harmony=True, json_schema=SCHEMA),
             "<|channel|>final<|message|>" + json.dumps(ANSWER) + "<|return|>"),
    Workload("required", StructuredOutputs(harmony=True, tools=[WEATHER, TIME], tool_choice="required"),
             "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
             + json.dumps(CALL_ARGS) + "<|call|>"),
    Workload("named", StructuredOutputs(harmony=True, tools=[WEATHER, TIME], tool_choice="named",
                                        tool_name="get_weather"),
             "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
             + json.dumps(CALL_ARGS) + "<|call|>"),
]


def budget() -> int:
    """The reasoning's token budget at MAX_TOKENS (grammar.harmony_lark's rule)."""
    from osserve.structured.grammar import REASONING_RESERVE

    return MAX_TOKENS - min(REASONING_RESERVE, (MAX_TOKENS + 1) // 2)


def output_tokens(work: Workload) -> tuple[list[int], list[str]]:
    """The request's 256 output tokens, and the kind of each position's mask: "analysis" (the
    reasoning's text, up to and with the `<|end|>` that closes it), "answer" or "stopped"."""
    enc = load_tokenizer().encoding
    head = enc.encode("<|channel|>analysis<|message|>", allowed_special="all")
    text = enc.encode(REASONING, allowed_special=set())
    assert len(text) >= budget(), "the reasoning must reach its budget"
    body = head + text[:budget()]
    tokens = body + enc.encode("<|end|><|start|>assistant" + work.tail, allowed_special="all")
    kinds = ["answer"] * len(head) + ["analysis"] * (budget() + 1) + ["answer"] * (len(tokens) - len(body) - 1)
    kinds += ["stopped"] * (MAX_TOKENS - len(tokens))
    tokens += [tokens[-1]] * (MAX_TOKENS - len(tokens))
    return tokens, kinds


KINDS = ("analysis", "answer", "stopped")


def timed(fn: Callable[..., object], *args: object) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def start_at(grammars: Iterable[Any], rid: str, prepared: Prepared, tokens: list[int], phase: int) -> None:
    """Start request `rid` in each grammars object (Grammars, or any with its interface) and feed it
    the walk's first `phase` tokens, as the engine would have by then."""
    for g in grammars:
        g.start(rid, prepared.text, prepared.free, prepared.bounded)
        assert g.ready(wait=True) == [(rid, None)]
        for t in tokens[:phase]:
            assert not g.accept({rid: t})


@dataclass
class Walk:
    """Requests on the walk of `tokens` in each grammars object, each at its position (`pos`): ids
    r0, r1, ... in the order they join; one that reaches the walk's end leaves and a new one joins
    at its start, so that a step's rows stay spread over the walk."""

    grammars: Iterable[Any]
    prepared: Prepared
    tokens: list[int]
    pos: dict[str, int] = field(default_factory=dict)
    joined: int = 0

    def join(self, phase: int) -> None:
        rid = f"r{self.joined}"
        self.joined += 1
        start_at(self.grammars, rid, self.prepared, self.tokens, phase)
        self.pos[rid] = phase

    def spread(self, batch: int) -> None:
        """`batch` requests, evenly spread over the walk."""
        for i in range(batch):
            self.join(i * MAX_TOKENS // batch)

    def advance(self, rids: Iterable[str], finished: Callable[[str], Any] | None = None) -> None:
        """Each of `rids` one token on; one at the walk's end is dropped from each grammars object
        (after `finished(rid)`, where given) and a new request joins at the start."""
        for r in rids:
            self.pos[r] += 1
            if self.pos[r] == MAX_TOKENS:
                if finished is not None:
                    finished(r)
                for g in self.grammars:
                    g.drop(r)
                del self.pos[r]
                self.join(0)


def run(work: Workload, batch: int, steps: int, make: Callable[[], Grammars]) -> dict[str, float]:
    """Median ms a step of masks() (all rows, then each kind of row alone) and accept(), median us
    a row of each kind, and the mean number of rows of each kind in a step."""
    tokens, kinds = output_tokens(work)
    whole, split = make(), make()
    prepared = whole.grammar_for(work.spec, MAX_TOKENS)  # as the engine starts a request
    assert prepared is not None
    walk = Walk((whole, split), prepared, tokens)
    walk.spread(batch)
    pos = walk.pos
    times: dict[str, list[float]] = {"all": [], "accept": []}
    counts: dict[str, list[int]] = {k: [] for k in KINDS}
    for _ in range(steps):
        rids = list(pos)
        times["all"].append(timed(whole.masks, rids))
        for kind in KINDS:
            group = [r for r in rids if kinds[pos[r]] == kind]
            counts[kind].append(len(group))
            if group:  # a step without such rows says nothing of them
                t = timed(split.masks, group)
                times.setdefault(kind, []).append(t)
                times.setdefault(kind + "_row", []).append(t / len(group))
        sampled = {r: tokens[pos[r]] for r in rids}
        times["accept"].append(timed(whole.accept, sampled))
        split.accept(sampled)
        assert not any(whole.failure(r) or split.failure(r) for r in rids), "the walk left the grammar"
        walk.advance(rids)
    out = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    out.update({"n_" + k: statistics.mean(v) for k, v in counts.items()})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32, 256])
    ap.add_argument("--workloads", nargs="+", default=[w.name for w in WORKLOADS])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=MAX_TOKENS)
    ap.add_argument("--modes", nargs="+", default=["llguidance", "shared"],
                    help="llguidance: every row's mask from llguidance; shared: free-text and finished rows "
                         "take their grammar's shared mask (Grammars' default)")
    ap.add_argument("--out", default=None, help="also write the table (markdown) here")
    args = ap.parse_args()
    vocab = load_tokenizer().vocab_size
    Grammars(vocab).masks([])  # the harmony vocabulary for llguidance: built once, not timed
    from osserve.structured.vocabulary import harmony_lltokenizer

    harmony_lltokenizer()
    lines = [f"CPU: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start, "
             f"llguidance mask threads {matchers.MASK_THREADS}; max_tokens {MAX_TOKENS} "
             f"(reasoning budget {budget()}); medians over {args.steps} steps, median of {args.rounds} rounds",
             "",
             "| workload | B | masks | rows analysis / answer / stopped | masks() ms/step | analysis rows alone ms "
             "| answer rows alone ms | stopped rows alone ms | us/row analysis / answer / stopped | accept() ms/step |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    nan = float("nan")
    for work in [w for w in WORKLOADS if w.name in args.workloads]:
        for batch in args.batches:
            # The modes' rounds alternate, so that a busy machine's moods fall on both.
            rounds: dict[str, list[dict[str, float]]] = {mode: [] for mode in args.modes}
            for _ in range(args.rounds):
                for mode in args.modes:
                    shared = mode == "shared"
                    rounds[mode].append(run(work, batch, args.steps, lambda s=shared: Grammars(vocab, shared_masks=s)))
            for mode, results in rounds.items():
                r = {k: statistics.median(x.get(k, nan) for x in results) for k in results[0]}
                n = " / ".join(f"{r['n_' + k]:.1f}" for k in KINDS)
                alone = " | ".join(f"{r.get(k, nan):.3f}" for k in KINDS)
                per_row = " / ".join(f"{1e3 * r.get(k + '_row', nan):.1f}" for k in KINDS)
                lines.append(f"| {work.name} | {batch} | {mode} | {n} | {r['all']:.3f} | {alone} | {per_row} "
                             f"| {r['accept']:.3f} |")
                print(lines[-1], flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
