"""Does filling a step's grammar masks slow the step loop's own Python? In structured_ab.sh's json
rounds (H100, 2026-11-26, 8db2968) the loop's schedule, launch and outputs took ~1.8 ms a step more
than in its plain rounds, beside the grammar's own ~2.7 ms. Here, on the host alone: 256 rows of
bench_masks' json_schema walk (its rows at every phase), and per step: begin_masks; a fixed stretch
of Python (the stand-in for the step before's outputs, which the loop runs while the mask threads
fill); end_masks; a second stretch (the sampler's launch, right after); accept. Each stretch is
timed against the same stretch in steps without masks, for each mask-lane count and GIL switch
interval. Table printed last.

    PYTHONPATH=$PWD python3 benchmarks/diag/mask_interference.py [--lanes 8 4 2 1] [--switch 0.0002 0.005]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass

from benchmarks.bench_masks import MAX_TOKENS, WORKLOADS, Walk, output_tokens
from osserve.structured.matchers import Grammars
from osserve.tokenizer import load_tokenizer


@dataclass
class Row:
    rid: int
    tokens: list[int]
    text: str


def stretch(rows: int, rounds: int) -> int:
    """Python of the loop's kind: small objects, dicts, lists, string formatting, per row."""
    made = 0
    for r in range(rounds):
        out: dict[str, Row] = {}
        for i in range(rows):
            row = Row(i, [i, r, i + r], f"r{i}")
            out[row.text] = row
            made += len(row.tokens)
        made += sum(len(v.text) for v in out.values())
    return made


def run(lanes: int, switch: float, steps: int, batch: int, rounds: int) -> dict[str, float]:
    sys.setswitchinterval(switch)
    work = WORKLOADS[0]
    tokens, _ = output_tokens(work)
    g = Grammars(load_tokenizer().vocab_size, lanes=lanes)
    prepared = g.grammar_for(work.spec, MAX_TOKENS)  # as the engine starts a request
    assert prepared is not None
    walk = Walk([g], prepared, tokens)
    walk.spread(batch)
    pos = walk.pos
    times: dict[str, list[float]] = {k: [] for k in ("during", "after", "plain during", "plain after", "wait")}
    for step in range(steps):
        rids = list(pos)
        fill = g.begin_masks(rids)
        t0 = time.perf_counter()
        stretch(batch, rounds)
        t1 = time.perf_counter()
        assert fill is not None
        masks = g.end_masks(fill)
        t2 = time.perf_counter()
        stretch(batch, rounds)
        t3 = time.perf_counter()
        g.accept({r: tokens[pos[r]] for r in rids})
        # The same stretches in a step without masks.
        t4 = time.perf_counter()
        stretch(batch, rounds)
        t5 = time.perf_counter()
        stretch(batch, rounds)
        t6 = time.perf_counter()
        if step >= 16:  # warm
            times["during"].append(t1 - t0)
            times["after"].append(t3 - t2)
            times["plain during"].append(t5 - t4)
            times["plain after"].append(t6 - t5)
            times["wait"].append(masks.waited)
        walk.advance(rids)
    return {k: 1e3 * statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lanes", type=int, nargs="+", default=[8, 4, 2, 1])
    ap.add_argument("--switch", type=float, nargs="+", default=[0.0002, 0.005])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=4, help="the stretch's size (rounds over the rows)")
    args = ap.parse_args()
    lines = [f"{os.cpu_count()} cores; {args.batch} json_schema rows; medians over {args.steps - 16} steps, ms",
             "| lanes | switch interval ms | stretch beside the fill | same, no masks | stretch after end_masks "
             "| same, no masks | end_masks' wait |", "|---|---|---|---|---|---|---|"]
    for switch, lanes in [(s, n) for s in args.switch for n in args.lanes]:
        r = run(lanes, switch, args.steps, args.batch, args.rounds)
        lines.append(f"| {lanes} | {1e3 * switch:g} | {r['during']:.3f} | {r['plain during']:.3f} "
                     f"| {r['after']:.3f} | {r['plain after']:.3f} | {r['wait']:.3f} |")
        print(lines[-1], flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
