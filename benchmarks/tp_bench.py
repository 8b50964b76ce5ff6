"""Tensor and expert parallelism on a multi-GPU host (random weights of the real shapes), one engine
per layout, each against TP 1 in the same process:

- agreement: 8 prompts (5 to 1000 tokens) decoded 32 greedy tokens in one batch (async
  scheduling, CUDA graphs): the share of prompts whose tokens equal TP 1's, and how far they
  agree (mean common prefix); then each prompt alone, teacher-forced with TP 1's tokens (every
  layout computes the logits of the same sequences), the median over the rows of
  |logits - TP 1's| / |TP 1's| and the share of rows with TP 1's argmax. On random weights these
  do not measure correctness: random 20b weights are ill-conditioned in bf16 (a router near-tie
  flipped by a last-bit difference picks another expert), and TP 1 and TP 2 part at the first
  token as two bf16 paths of one layout do (2 x H200, 2026-11-26: 55% for the 20b, 105% for the
  120b; benchmarks/diag/engine_vs_whole.py). On a real checkpoint they are the check; on dummy
  weights tests/gpu/test_tp_gpu.py's, against the whole model in float32, is;
- speed: batch-1 and batch-32 decode (1024-token prompts, greedy), as bench_decode.py.

    python3 benchmarks/tp_bench.py --presets 20b,120b --layouts 1,2,4,8,4ep,8ep --out DIR/tp-PRESET.json
    python3 benchmarks/tp_bench.py --table DIR      # this script's JSONs and tp_run.sh's serving runs: one table

Layouts: N (tensor parallel over N GPUs) or Nep (expert parallel, --enable-expert-parallel). TP 1
runs first and is the reference; layouts wanting more GPUs than there are are left out.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from osserve.bench.latency import run_once
from osserve.distributed.parallel_runner import ParallelRunner
from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.engine import LLMEngine
from osserve.engine.load import EngineArgs, build_engine

T = TypeVar("T")
LENGTHS = (5, 130, 300, 17, 260, 64, 1000, 40)
STEPS = 32


def parse_layout(text: str) -> tuple[int, bool]:
    return int(text.removesuffix("ep")), text.endswith("ep")


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 199_000, (n,), generator=g).tolist() for n in LENGTHS]


def greedy_batch(engine: LLMEngine, ps: list[list[int]]) -> list[list[int]]:
    for i, p in enumerate(ps):
        engine.add_request(f"g{i}", p, SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True))
    out: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for d in engine.step():
            out.setdefault(d.request_id, []).extend(d.new_token_ids)
    return [out[f"g{i}"] for i in range(len(ps))]


def forced_logits(engine: LLMEngine, ps: list[list[int]], tokens: list[list[int]]) -> torch.Tensor:
    """[rows, vocab] float32 on the host: each prompt alone, its steps forced to `tokens`."""
    rows: list[torch.Tensor] = []
    runner = engine.runner
    original = runner.run

    def run(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = original(*args, **kwargs)
        rows.append(out.logits.float().cpu())
        return out

    runner.run = run  # type: ignore[method-assign]
    try:
        for i, (p, t) in enumerate(zip(ps, tokens, strict=True)):
            engine.add_request(f"f{i}", p, SamplingParams(temperature=0, max_tokens=len(t), ignore_eos=True,
                                                          forced_token_ids=list(t)))
            while engine.has_unfinished():
                engine.step()
    finally:
        runner.run = original  # type: ignore[method-assign]
    return torch.cat(rows)


def compare(tokens: list[list[int]], logits: torch.Tensor, ref_tokens: list[list[int]],
            ref_logits: torch.Tensor) -> dict[str, float]:
    def prefix(a: list[int], b: list[int]) -> int:
        return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))

    rel = ((logits - ref_logits).norm(dim=1) / ref_logits.norm(dim=1)).median().item()
    return {"greedy_equal": sum(a == b for a, b in zip(tokens, ref_tokens, strict=True)) / len(tokens),
            "greedy_prefix": statistics.mean(prefix(a, b) for a, b in zip(tokens, ref_tokens, strict=True)) / STEPS,
            "logits_rel_diff": rel,
            "top1_agree": (logits.argmax(1) == ref_logits.argmax(1)).float().mean().item()}


def with_engine(args: EngineArgs, use: Callable[[LLMEngine], T]) -> T:
    """use(an engine built from args); then its ranks stopped and its memory handed back, so that
    one process can build one layout's engine after another."""
    engine = build_engine(args)
    try:
        return use(engine)
    finally:
        if isinstance(engine.runner, ParallelRunner):
            engine.runner.shutdown()
        del engine
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()


def run_layout(preset: str, n: int, ep: bool, ref: dict[str, Any] | None, output_len: int,
               gpu_util: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """(this layout's row, the reference data: TP 1's tokens and logits)."""
    def measure(engine: LLMEngine) -> tuple[dict[str, Any], dict[str, Any]]:
        ps = prompts()
        tokens = greedy_batch(engine, ps)
        forced = ref["tokens"] if ref is not None else tokens
        logits = forced_logits(engine, ps, forced)
        reference = ref or {"tokens": tokens, "logits": logits}
        row: dict[str, Any] = {"preset": preset, "layout": f"TP {n}" + (" EP" if ep else ""),
                               **compare(tokens, logits, reference["tokens"], reference["logits"])}
        run_once(engine, 1, 128, 16, seed=99)  # warm-up
        b1 = run_once(engine, 1, 1024, output_len, seed=1)
        b32 = run_once(engine, 32, 1024, output_len, seed=2)
        row |= {"b1_tok_s": b1.decode_tok_s, "b1_tpot_ms": b1.tpot_median_ms, "b32_tok_s": b32.decode_tok_s,
                "b32_tpot_ms": b32.tpot_median_ms, "rank0_peak_gib": torch.cuda.max_memory_allocated() / 2**30}
        # Printed before the ranks are shut down: two x2 runs (the second 2026-11-26) built TP 2, then printed
        # nothing for minutes, and a stall in the shutdown must not take the figures with it.
        print(json.dumps(row), flush=True)
        return row, reference

    return with_engine(EngineArgs(load_format="dummy", preset=preset, max_model_len=4096, max_num_seqs=64,
                                  tensor_parallel_size=n, enable_expert_parallel=ep,
                                  gpu_memory_utilization=gpu_util), measure)


def table(folder: Path) -> None:
    """One table: every tp-*.json row, with the serving runs (serve-PRESET-LAYOUT-cC.json) beside it."""
    rows = [r for f in sorted(folder.glob("tp-*.json")) for r in json.loads(f.read_text())["rows"]]
    serving: dict[tuple[str, str], dict[int, float]] = {}
    for f in sorted(folder.glob("serve-*-c*.json")):
        _, preset, layout, c = f.stem.split("-")
        runs = json.loads(f.read_text())["runs"]
        if runs:
            s = runs[0]["summary"]
            serving.setdefault((preset, layout), {})[int(c[1:])] = s["output_throughput"] if not s["failed"] else -1
    device = json.loads(next(folder.glob("tp-*.json")).read_text())["device"] if rows else "?"
    print(f"\n{device}; agreement with TP 1 (same process; on random weights not correctness: docstring), "
          "decode of 1024-token prompts, serving 1k/1k random")
    head = (f"{'preset':>6} {'layout':>8} {'greedy =':>8} {'prefix':>6} {'logit diff':>10} {'top-1':>6} "
            f"{'b1 tok/s':>9} {'b1 ms':>7} {'b32 tok/s':>9} {'c256 tok/s':>10} {'c512 tok/s':>10}")
    print(head)
    for r in rows:
        key = (r["preset"], r["layout"].replace(" ", "").lower())
        serve = serving.get(key, {})
        print(f"{r['preset']:>6} {r['layout']:>8} {r['greedy_equal']:>8.2f} {r['greedy_prefix']:>6.2f} "
              f"{r['logits_rel_diff']:>10.4f} {r['top1_agree']:>6.3f} {r['b1_tok_s']:>9.1f} {r['b1_tpot_ms']:>7.2f} "
              f"{r['b32_tok_s']:>9.1f} {serve.get(256, float('nan')):>10.1f} {serve.get(512, float('nan')):>10.1f}")
    for (preset, layout), serve in sorted(serving.items()):
        if not any((r["preset"], r["layout"].replace(" ", "").lower()) == (preset, layout) for r in rows):
            print(f"{preset:>6} {layout:>8} {'':>8} {'':>6} {'':>10} {'':>6} {'':>9} {'':>7} {'':>9} "
                  f"{serve.get(256, float('nan')):>10.1f} {serve.get(512, float('nan')):>10.1f}")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", default="20b")
    ap.add_argument("--layouts", default="1,2,4,8")
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.90)
    ap.add_argument("--out", default=None, help="JSON file; {preset} is replaced by the preset")
    ap.add_argument("--table", default=None, metavar="DIR", help="print the table of DIR's results and exit")
    args = ap.parse_args()
    if args.table:
        table(Path(args.table))
        return
    gpus = torch.cuda.device_count()
    layouts = [parse_layout(x) for x in args.layouts.split(",")]
    if layouts[0] != (1, False):
        sys.exit("--layouts must start with 1 (TP 1 is the reference)")
    for preset in args.presets.split(","):
        rows, ref = [], None
        for n, ep in layouts:
            if n > gpus:
                print(f"{preset} TP {n}{' EP' if ep else ''}: left out, {gpus} GPUs", flush=True)
                continue
            row, ref = run_layout(preset, n, ep, ref, args.output_len, args.gpu_memory_utilization)
            rows.append(row)
            if args.out:  # after every layout: a later one that stalls leaves the earlier ones written
                device = f"{gpus} x {torch.cuda.get_device_name()}"
                Path(args.out.format(preset=preset)).write_text(json.dumps({"device": device, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
