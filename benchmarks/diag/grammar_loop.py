"""The step loop's grammar work in the engine's process (matchers.Grammars) against a process of its
own (grammar_process.RemoteGrammars), on the CPU, no model: B constrained requests walk bench_masks'
json_schema turn in step, in the engine's order (engine.py): the step before's tokens accepted
(deferred where the grammars are remote), begin_masks, a fixed amount of the loop's own Python
(OUTPUTS_MS alone), (a stand-in for turning the step before's tokens into deltas, the work the mask
threads' GIL hand-overs slow), end_masks; for each number of mask lanes and of grammar processes
given. The loop runs at the engine process' switch interval. Reported: the first step (a new process
builds llguidance's tables), the median and p99 ms a step of the whole loop and of the stand-in
alone, the worst later step and how many took over 20 ms; the medians of accept, begin_masks and
end_masks (in the engine's process their sum with the stand-in's slowdown is the loop's grammar
cost; for the remote ones end_masks is the wait for the child's reply).

    PYTHONPATH=$PWD python benchmarks/diag/grammar_loop.py [--batch 256] [--steps 512] [--outputs-ms 2] [--lanes 2 4 8]
        [--shards 1 2 4] [--child-switch 0.005 0.0002]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from benchmarks.bench_masks import MAX_TOKENS, WORKLOADS, Walk, output_tokens
from osserve.engine.process_engine import SWITCH_INTERVAL_S
from osserve.structured.grammar_process import RemoteGrammars
from osserve.structured.matchers import MASK_THREADS, Grammars
from osserve.tokenizer import load_tokenizer


def busy(rounds: int) -> float:
    """A fixed amount of pure Python (dict and list work, as turning tokens into deltas is); returns
    its wall time, which threads taking the GIL stretch."""
    start = time.perf_counter()
    scratch: dict[int, list[int]] = {}
    for _ in range(rounds):
        for i in range(50):
            scratch.setdefault(i, []).append(i)
        scratch.clear()
    return time.perf_counter() - start


def rounds_for(ms: float) -> int:
    """busy's rounds that take about ms alone."""
    trial = 2000
    return max(1, round(trial * ms / 1e3 / min(busy(trial) for _ in range(5))))


def walk(grammars: Grammars | RemoteGrammars, batch: int, steps: int, outputs: int) -> dict[str, float]:
    work = WORKLOADS[0]
    tokens, _ = output_tokens(work)
    prepared = grammars.grammar_for(work.spec, MAX_TOKENS)
    assert prepared is not None
    remote = isinstance(grammars, RemoteGrammars)
    walk = Walk([grammars], prepared, tokens)
    walk.spread(batch)
    pos = walk.pos
    loop, stand_in, accept, begin, end = [], [], [], [], []
    sampled: dict[str, int] = {}
    for _ in range(steps):
        start = time.perf_counter()
        if sampled:
            assert not grammars.accept(sampled, defer=remote)
        accepted = time.perf_counter()
        rids = list(pos)
        fill = grammars.begin_masks(rids)
        assert fill is not None
        begun = time.perf_counter()
        stand_in.append(busy(outputs))
        ending = time.perf_counter()
        masks = grammars.end_masks(fill)
        end.append(time.perf_counter() - ending)
        accept.append(accepted - start)
        begin.append(begun - accepted)
        assert not masks.dead and not masks.rejected, "the walk left the grammar"
        loop.append(time.perf_counter() - start)
        sampled = {r: tokens[pos[r]] for r in rids}
        # A request at the walk's end is fed its last token first, as the engine feeds it.
        walk.advance(rids, lambda r, now=sampled: grammars.accept({r: now.pop(r)}, defer=remote))

    def ms(xs: list[float], q: float) -> float:
        return 1e3 * sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]

    return {"first step": 1e3 * loop[0], "loop p50": 1e3 * statistics.median(loop), "loop p99": ms(loop, 0.99),
            "loop max after the first": 1e3 * max(loop[1:]), "steps over 20 ms": sum(t > 0.02 for t in loop[1:]),
            "outputs p50": 1e3 * statistics.median(stand_in), "outputs p99": ms(stand_in, 0.99),
            "accept p50": 1e3 * statistics.median(accept), "begin_masks p50": 1e3 * statistics.median(begin),
            "end_masks p50": 1e3 * statistics.median(end)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=512)
    ap.add_argument("--outputs-ms", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--lanes", type=int, nargs="+", default=[MASK_THREADS],
                    help="mask lanes (each setting runs in both places)")
    ap.add_argument("--shards", type=int, nargs="+", default=[1], help="grammar processes to run with")
    ap.add_argument("--child-switch", type=float, nargs="+", default=[None],
                    help="the grammar process's GIL switch intervals to run (s; default: its own)")
    args = ap.parse_args()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    vocab = load_tokenizer().vocab_size
    outputs = rounds_for(args.outputs_ms)
    rows = []
    for _ in range(args.rounds):
        for lanes in args.lanes:
            places = [("in process", None, 0)] + [("own process", switch, shards) for switch in args.child_switch
                                                  for shards in args.shards]
            for place, switch, shards in places:
                if switch is not None:  # read by the child at its import
                    os.environ["OSSERVE_GRAMMAR_SWITCH_INTERVAL_S"] = str(switch)
                grammars = (Grammars(vocab, lanes=lanes) if place == "in process"
                            else RemoteGrammars(vocab, args.batch, lanes=lanes, shards=shards))
                name = f"{place}, {lanes} lanes" + (f", {shards} processes" if shards else "") + (
                    f", child's switch interval {switch * 1e3:g} ms" if switch else "")
                rows.append((name, walk(grammars, args.batch, args.steps, outputs)))
            print(name, {k: round(v, 3) for k, v in rows[-1][1].items()}, flush=True)
    keys = list(rows[0][1])
    print(f"\nB={args.batch}, {args.steps} steps, outputs stand-in {args.outputs_ms} ms; ms a step")
    print("| grammars | " + " | ".join(keys) + " |\n|---|" + "---|" * len(keys))
    for name, r in rows:
        print(f"| {name} | " + " | ".join(f"{r[k]:.3f}" for k in keys) + " |")


if __name__ == "__main__":
    main()
