"""Speculative decoding on one GPU: what its steps cost, and its speed at controlled acceptance.

    source benchmarks/gpu_env.sh
    python3 benchmarks/bench_spec.py                     # 20b and 120b, batch 1 and 32, AL 1.0 / 2.4 / 3.0
    python3 benchmarks/bench_spec.py --presets 20b --batches 1 --al 2.4 --modes chain

Random weights (`--load-format dummy`: the target's, and a random EAGLE3 draft of the published
shape, 32000 draft tokens) accept almost nothing, so two kinds of numbers:
(a) Costs, measured in a spec run with every draft accepted: the target's verify forward (chain:
    num_speculative_tokens + 1 tokens a request; tree: num_draft_tokens), the draft's passes, the
    verification, and the whole speculative step, against the plain decode step (TPOT).
(b) Decode tok/s at a controlled mean acceptance length (AL). A plain run records each request's
    greedy output; then the benchmark-only oracle (osserve/speculative/oracle.py, never reachable
    from a request or flag) sets each drafted token to the recorded one with the probability that
    gives the chosen AL, and the target verifies as always. The AL column is the one measured. At
    AL 1.0 speculation's auto-off (speculative/decoder.py) is what is measured.
One engine per preset (the tree config, whose lookahead is the larger); `engine.spec` is swapped
between none (plain), chain and tree. A random draft's head gives nearly flat distributions, so a
tree's best nodes would all sit at depth 1 or 2 and no tree could reach AL 3; its head is scaled
(--draft-confidence, default 8) so that, like a trained draft's, its top guesses stand out and its
trees grow deep (the chain's argmax does not change). Tables print last; --out FILE writes them as
JSON too.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from osserve.engine.core.sampling_params import SamplingParams  # noqa: E402
from osserve.engine.engine import LLMEngine  # noqa: E402
from osserve.engine.load import EngineArgs, build_engine  # noqa: E402
from osserve.speculative.config import SpeculativeConfig, parse_speculative_config  # noqa: E402
from osserve.speculative.decoder import SpeculativeDecoder  # noqa: E402
from osserve.speculative.eagle import Eagle3Proposer  # noqa: E402
from osserve.speculative.oracle import AcceptanceOracle, acceptance_for  # noqa: E402

MODES = {  # the SGLang gpt-oss post's chain (3 / 1 / 4) and tree (5 / 4 / 8)
    "chain": {"method": "eagle3", "num_speculative_tokens": 3, "topk": 1, "num_draft_tokens": 4},
    "tree": {"method": "eagle3", "num_speculative_tokens": 5, "topk": 4, "num_draft_tokens": 8},
}


@dataclass
class Run:
    outputs: dict[str, list[int]]
    tok_s: float  # decode tokens/s: every token after each request's first, over the steps that gave them
    tpot_ms: float  # median step time
    al: float | None  # measured mean acceptance length (speculative runs)


def prompts(batch: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 199_998, (length,), generator=g).tolist() for _ in range(batch)]


def timed_run(engine: LLMEngine, ps: list[list[int]], output_len: int) -> Run:
    """All prompts at once, greedy, ignore_eos; timing from each request's first token on."""
    for i, p in enumerate(ps):
        engine.add_request(f"b{i}", p, SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True))
    outputs: dict[str, list[int]] = defaultdict(list)
    steps: list[float] = []
    tokens = 0
    while engine.has_unfinished():
        t0 = time.perf_counter()
        deltas = engine.step()
        dt = time.perf_counter() - t0
        if all(len(outputs[f"b{i}"]) for i in range(len(ps))):
            new = sum(len(d.new_token_ids) for d in deltas)
            if new:
                steps.append(dt)
                tokens += new
        for d in deltas:
            outputs[d.request_id].extend(d.new_token_ids)
    spec = engine.spec
    al = spec.stats.mean_acceptance_length if spec is not None and spec.stats.num_drafts else None
    return Run(dict(outputs), tokens / max(sum(steps), 1e-9), 1000 * statistics.median(steps) if steps else 0.0, al)


def decoder_for(engine: LLMEngine, raw: dict[str, Any]) -> SpeculativeDecoder:
    """A decoder of another shape over the engine's draft and draft cache."""
    base = engine.spec
    assert base is not None and isinstance(base.proposer, Eagle3Proposer)
    cfg = parse_speculative_config(dict(raw, disable_by_batch_size=base.config.disable_by_batch_size))
    assert isinstance(cfg, SpeculativeConfig) and cfg.lookahead_slots <= base.config.lookahead_slots
    p = base.proposer
    return SpeculativeDecoder(cfg, Eagle3Proposer(p.draft, p.kv_cache, p.block_size, cfg, p.device),
                              engine.model_config.vocab_size, engine.max_model_len)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class Timer:
    """Wraps methods to time each call (synchronised: for the cost table only, not the speed runs)."""

    def __init__(self) -> None:
        self.ms: dict[str, list[float]] = defaultdict(list)
        self.undo: list[Callable[[], None]] = []

    def wrap(self, owner: object, name: str, label: str) -> None:
        real = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            sync()
            t0 = time.perf_counter()
            out = real(*args, **kwargs)
            sync()
            self.ms[label].append(1000 * (time.perf_counter() - t0))
            return out

        setattr(owner, name, timed)
        self.undo.append(lambda: setattr(owner, name, real))

    def restore(self) -> None:
        for undo in self.undo:
            undo()

    def median(self, label: str) -> float:
        return statistics.median(self.ms[label]) if self.ms[label] else float("nan")


def costs(engine: LLMEngine, mode: str, ps: list[list[int]], plain: Run, output_len: int) -> dict[str, float]:
    """Per-step costs in a run where every draft is accepted (steady speculative steps)."""
    spec = engine.spec
    assert spec is not None
    spec.oracle = AcceptanceOracle(plain.outputs, 1.0, engine.model_config.vocab_size, seed=7)
    timer = Timer()
    timer.wrap(engine.runner, "run", "verify forward")
    timer.wrap(spec.proposer, "propose", "draft")
    timer.wrap(spec, "verify", "verification")
    timer.wrap(engine, "_spec_step", "step")
    try:
        timed_run(engine, ps, min(output_len, 64))
    finally:
        timer.restore()
    return {label: timer.median(label) for label in ("verify forward", "draft", "verification", "step")}


def bench_preset(name: str, args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    t0 = time.perf_counter()
    engine = build_engine(EngineArgs(load_format="dummy", preset=name, speculative_config=MODES["tree"],
                                     max_model_len=args.input_len + args.output_len + 64, device=args.device,
                                     gpu_memory_utilization=args.gpu_memory_utilization, seed=args.seed))
    print(f"[{name}] engine built in {time.perf_counter() - t0:.0f} s", flush=True)
    assert engine.spec is not None and isinstance(engine.spec.proposer, Eagle3Proposer)
    head = engine.spec.proposer.draft.head
    assert head is not None
    with torch.no_grad():
        head.mul_(args.draft_confidence)
    decoders = {"tree": engine.spec, "chain": decoder_for(engine, MODES["chain"])}
    speed, cost = [], []
    for batch in args.batches:
        ps = prompts(batch, args.input_len, seed=batch)
        engine.spec = None
        timed_run(engine, ps, 8)  # warm-up: prefill of these prompts, graphs
        plain = timed_run(engine, ps, args.output_len)
        print(f"[{name}] batch {batch} plain: {plain.tok_s:,.1f} tok/s, TPOT {plain.tpot_ms:.2f} ms", flush=True)
        speed.append({"preset": name, "batch": batch, "mode": "plain", "al_target": None, "al": None,
                      "tok_s": plain.tok_s, "tpot_ms": plain.tpot_ms, "speedup": 1.0})
        for mode in args.modes:
            spec = decoders[mode]
            assert spec is not None
            engine.spec = spec
            depth = spec.config.num_speculative_tokens
            for al in args.al:
                spec.reset_stats()
                spec.oracle = AcceptanceOracle(plain.outputs, acceptance_for(al, depth),
                                               engine.model_config.vocab_size, seed=int(al * 10))
                run = timed_run(engine, ps, args.output_len)
                same = sum(run.outputs[k] == plain.outputs[k] for k in plain.outputs)
                print(f"[{name}] batch {batch} {mode} AL {al}: measured AL {run.al or 1.0:.2f}, {run.tok_s:,.1f} "
                      f"tok/s ({run.tok_s / plain.tok_s:.2f}x), greedy outputs equal to plain: {same}/{batch}",
                      flush=True)
                speed.append({"preset": name, "batch": batch, "mode": mode, "al_target": al, "al": run.al,
                              "tok_s": run.tok_s, "tpot_ms": run.tpot_ms, "speedup": run.tok_s / plain.tok_s,
                              "same_outputs": same})
            spec.reset_stats()
            c = costs(engine, mode, ps, plain, args.output_len)
            tokens = spec.config.num_draft_tokens
            cost.append({"preset": name, "batch": batch, "mode": mode, "verify_tokens": tokens,
                         "plain_step_ms": plain.tpot_ms, **c})
            print(f"[{name}] batch {batch} {mode} costs (ms): {c}", flush=True)
            spec.oracle = None
        engine.spec = decoders["tree"]
    del engine, decoders
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return speed, cost


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default="20b,120b")
    p.add_argument("--batches", default="1,32")
    p.add_argument("--al", default="1.0,2.4,3.0")
    p.add_argument("--modes", default="chain,tree")
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=160)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.92)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    p.add_argument("--device", default=None, help="cpu: a dry run of the script (with --presets tiny)")
    p.add_argument("--draft-confidence", type=float, default=8.0, help="the random draft's head scaled by this")
    args = p.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    args.al = [float(a) for a in args.al.split(",")]
    args.modes = args.modes.split(",")
    print(f"device: {torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'}", flush=True)
    speed: list[dict[str, Any]] = []
    cost: list[dict[str, Any]] = []
    for name in args.presets.split(","):
        s, c = bench_preset(name, args)
        speed += s
        cost += c
    print("\ncosts (ms, median; a speculative run with every draft accepted; synchronised per call)")
    print("| preset | batch | mode | tokens verified / request | plain decode step | verify forward | draft passes "
          "| verification | whole spec step |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in cost:
        print(f"| {c['preset']} | {c['batch']} | {c['mode']} | {c['verify_tokens']} | {c['plain_step_ms']:.2f} | "
              f"{c['verify forward']:.2f} | {c['draft']:.2f} | {c['verification']:.2f} | {c['step']:.2f} |")
    print(f"\ndecode tok/s at controlled acceptance (input {args.input_len}, output {args.output_len}, greedy; "
          "AL: measured, 1 + accepted / drafts)")
    print("| preset | batch | mode | AL target | AL measured | tok/s | x plain | TPOT ms |")
    print("|---|---|---|---|---|---|---|---|")
    for r in speed:
        al_t = "-" if r["al_target"] is None else f"{r['al_target']:.1f}"
        al = "-" if r["al"] is None else f"{r['al']:.2f}"
        print(f"| {r['preset']} | {r['batch']} | {r['mode']} | {al_t} | {al} | {r['tok_s']:,.1f} | "
              f"{r['speedup']:.2f} | {r['tpot_ms']:.2f} |")
    if args.out:
        Path(args.out).write_text(json.dumps({"speed": speed, "costs": cost}, indent=2))


if __name__ == "__main__":
    main()
