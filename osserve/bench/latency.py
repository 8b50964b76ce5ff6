"""`osserve bench latency`: offline batch latency and throughput of the engine itself.

A batch of `batch_size` random prompts of `input_len` tokens, each generating exactly
`output_len` tokens (greedy, ignore_eos). Every step call is timed (a call returns host token
ids, so it has synchronised). Prefill time runs until every request's first token reaches the
host; each later
call that delivers tokens is a decode step: decode tokens/s = tokens delivered after the first /
their calls' time; time per output token = a call's time (with async scheduling a call launches
step N+1 and delivers step N: in steady state, one step).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from dataclasses import asdict, dataclass, replace

import torch
from rich.console import Console
from rich.table import Table

from osserve.bench.loadgen import load_schema
from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.engine import LLMEngine
from osserve.engine.load import EngineArgs, build_engine
from osserve.structured.spec import StructuredOutputs


@dataclass
class LatencyResult:
    batch_size: int
    input_len: int
    output_len: int
    prefill_s: float
    prefill_tok_s: float
    decode_s: float
    decode_tok_s: float
    tpot_median_ms: float
    tpot_p90_ms: float
    e2e_s: float
    peak_gpu_mem_gib: float | None


def run_once(engine: LLMEngine, batch: int, input_len: int, output_len: int, seed: int,
             json_schema: dict | None = None) -> LatencyResult:
    """json_schema: each request is a harmony turn whose answer follows it (its reasoning free), so
    every step of every request fills and applies a grammar's token mask."""
    g = torch.Generator().manual_seed(seed)
    vocab = min(engine.model_config.vocab_size, 199_998)  # ordinary tokens only
    structured = StructuredOutputs(json_schema=json_schema, harmony=True) if json_schema is not None else None
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True, structured=structured)
    for i in range(batch):
        prompt = torch.randint(0, vocab, (input_len,), generator=g).tolist()
        engine.add_request(f"bench-{seed}-{i}", prompt, replace(params))
    step_times: list[float] = []
    decode_tokens = 0
    start = time.perf_counter()
    first_token_at: float | None = None
    started: set[str] = set()
    while engine.has_unfinished():
        t0 = time.perf_counter()
        deltas = engine.step()
        t1 = time.perf_counter()
        new_tokens = sum(len(d.new_token_ids) for d in deltas)
        if first_token_at is None:  # prefill lasts until every request's first token is on the host
            started |= {d.request_id for d in deltas if d.new_token_ids}
            first_token_at = t1 if len(started) == batch else None
        elif new_tokens:  # with async scheduling a step's tokens arrive during the next call
            step_times.append(t1 - t0)
            decode_tokens += new_tokens
    prefill_s = (first_token_at or time.perf_counter()) - start
    e2e = time.perf_counter() - start
    decode_s = sum(step_times)
    quantiles = statistics.quantiles(step_times, n=10) if len(step_times) > 1 else step_times * 9
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    return LatencyResult(
        batch_size=batch, input_len=input_len, output_len=output_len,
        prefill_s=prefill_s, prefill_tok_s=batch * input_len / max(prefill_s, 1e-9),
        decode_s=decode_s, decode_tok_s=decode_tokens / max(decode_s, 1e-9),
        tpot_median_ms=1000 * statistics.median(step_times) if step_times else 0.0,
        tpot_p90_ms=1000 * quantiles[8] if step_times else 0.0,
        e2e_s=e2e, peak_gpu_mem_gib=peak,
    )


def run_bench_latency(args: argparse.Namespace) -> int:
    # The memory plan and the kernels it runs (engine/load.py's log lines) belong with the figures.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    engine = build_engine(EngineArgs.from_namespace(args))
    schema = load_schema(getattr(args, "json_schema", None))
    for w in range(args.warmup):
        run_once(engine, args.batch_size, args.input_len, min(args.output_len, 16), seed=1000 + w,
                 json_schema=schema)
    results = [
        run_once(engine, args.batch_size, args.input_len, args.output_len, seed=r, json_schema=schema)
        for r in range(args.repeats)
    ]
    table = Table(title=f"osserve bench latency (batch {args.batch_size}, in {args.input_len}, "
                        f"out {args.output_len})")
    for col in ("run", "prefill tok/s", "decode tok/s", "TPOT p50 ms", "TPOT p90 ms", "e2e s", "peak GiB"):
        table.add_column(col, justify="right")
    for i, r in enumerate(results):
        table.add_row(str(i), f"{r.prefill_tok_s:,.0f}", f"{r.decode_tok_s:,.1f}",
                      f"{r.tpot_median_ms:.2f}", f"{r.tpot_p90_ms:.2f}", f"{r.e2e_s:.2f}",
                      "-" if r.peak_gpu_mem_gib is None else f"{r.peak_gpu_mem_gib:.1f}")
    Console().print(table)
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items() if _jsonable(v)},
                       "results": [asdict(r) for r in results]}, f, indent=2)
    return 0


def _jsonable(v: object) -> bool:
    return isinstance(v, str | int | float | bool | type(None))
