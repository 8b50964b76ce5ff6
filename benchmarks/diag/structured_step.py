"""Where the engine's step time goes when every request of a serving-size batch carries a JSON
schema (one GPU, random weights, no HTTP): 256 requests of 64 random prompt tokens, 256 out,
temperature 1, ignore_eos (what structured_ab.sh's serving rounds send), run plain, with
bench_structured.SCHEMA, and with that schema less its strings' maxLength, twice each. The engine's
own phases are timed by wrapping its methods (host clock, summed over the decode steps, per step):
schedule, the forward's launch, the wait for the step before's tokens, the grammars' accept, the
masks' start and their end (with the grammar processes, the wait for their replies), the sampler's
launch, the outputs. Table printed last.

    PYTHONPATH=$PWD python3 benchmarks/diag/structured_step.py [--batch 256] [--device cpu]
"""

from __future__ import annotations

import argparse
import copy
import functools
import logging
import random
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from benchmarks.bench_structured import SCHEMA
from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.load import EngineArgs, build_engine
from osserve.structured.spec import StructuredOutputs

PHASES = ("schedule", "forward launch", "collect (wait + accept)", "accept", "masks begin", "masks end (wait)",
          "sample launch", "outputs")


def timed(spent: dict[str, float], phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[phase] += time.perf_counter() - start
    return wrapper


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="20b")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--output", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--device", default=None, help="cpu: a dry run (tiny preset, small batch)")
    args = ap.parse_args()
    engine = build_engine(EngineArgs(load_format="dummy", preset=args.preset, max_model_len=4096,
                                     max_num_seqs=args.batch, max_num_batched_tokens=8192,
                                     gpu_memory_utilization=0.90, device=args.device))
    spent: dict[str, float] = defaultdict(float)
    engine.scheduler.schedule = timed(spent, "schedule", engine.scheduler.schedule)  # type: ignore[method-assign]
    engine.runner.run = timed(spent, "forward launch", engine.runner.run)  # type: ignore[method-assign]
    engine._collect = timed(spent, "collect (wait + accept)", engine._collect)  # type: ignore[method-assign]
    engine.grammars.accept = timed(spent, "accept", engine.grammars.accept)  # type: ignore[method-assign]
    engine.grammars.begin_masks = timed(spent, "masks begin", engine.grammars.begin_masks)  # type: ignore[method-assign]
    engine.grammars.end_masks = timed(spent, "masks end (wait)", engine.grammars.end_masks)  # type: ignore[method-assign]
    engine._launch_sample = timed(spent, "sample launch", engine._launch_sample)  # type: ignore[method-assign]
    engine._finish = timed(spent, "outputs", engine._finish)  # type: ignore[method-assign]
    nomax = copy.deepcopy(SCHEMA)
    del nomax["properties"]["steps"]["items"]["maxLength"]
    modes = {"plain": None, "json": SCHEMA, "nomax": nomax}
    rng = random.Random(0)
    rows = []
    for r in range(-1, args.rounds):  # round -1 builds the grammar machinery and the kernels, untimed
        for mode, schema in modes.items():
            structured = StructuredOutputs(json_schema=schema, harmony=True) if schema is not None else None
            for i in range(args.batch):
                params = SamplingParams(temperature=1.0, max_tokens=args.output if r >= 0 else 16, ignore_eos=True,
                                        structured=copy.deepcopy(structured))
                engine.add_request(f"{mode}-{r}-{i}", [rng.randrange(1000, 190000) for _ in range(64)], params)
            steps, tokens, wall = 0, 0, 0.0
            spent.clear()
            while engine.has_unfinished():
                start = time.perf_counter()
                deltas = engine.step()
                steps += 1
                tokens += sum(len(d.new_token_ids) for d in deltas)
                wall += time.perf_counter() - start
            if r >= 0:
                rows.append((mode, r, tokens / wall, 1e3 * wall / steps, {p: 1e3 * spent[p] / steps for p in PHASES}))
                print(rows[-1], flush=True)
    print(f"\n{args.preset}, batch {args.batch}, 64 prompt tokens, {args.output} out, temperature 1; "
          "ms a step (host clock), the whole run's steps")
    print("| run | round | out tok/s | step | " + " | ".join(PHASES) + " |")
    print("|---|---|---|---|" + "---|" * len(PHASES))
    for mode, r, tok_s, step_ms, phases in rows:
        cells = " | ".join(f"{phases[p]:.2f}" for p in PHASES)
        print(f"| {mode} | {r} | {tok_s:,.0f} | {step_ms:.2f} | {cells} |")


if __name__ == "__main__":
    main()
