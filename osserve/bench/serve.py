"""`osserve bench serve`: load an OpenAI-compatible server and report what its users feel.

    osserve bench serve --base-url http://127.0.0.1:8000 --model NAME --endpoint chat \\
        --num-requests 2000 --concurrency 256 --max-tokens 256 --ignore-eos \\
        --output-json run.json --plot run.png [--sweep 1,8,32,128,256]

JSON (--output-json): {"config": {...}, "runs": [{"concurrency": C, "summary": {...},
"records": [{start, ttft, first_event, itl, latency, prompt_tokens, output_tokens, error, chunk_times}]}]}
with times in seconds in records and milliseconds in the summary's *_ms fields.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import asdict, replace
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
from rich.table import Table

from osserve.bench.loadgen import LoadConfig, load_schema, run_load
from osserve.bench.processes import auto_workers, run_load_in_processes
from osserve.bench.stats import records_json, summarize


def add_bench_serve_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="load an OpenAI-compatible server (streaming) and report latencies")
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--endpoint", choices=("chat", "completions", "responses"), default="chat")
    p.add_argument("--num-requests", type=int, default=100)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--request-rate", type=float, default=None)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--dataset", choices=("fixed", "random", "sharegpt-like"), default="fixed")
    p.add_argument("--prompt", default=LoadConfig.prompt)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole run")
    p.add_argument("--api-key", default=None)
    p.add_argument("--output-json", default=None)
    p.add_argument("--plot", default=None, help="PNG path")
    p.add_argument("--workers", default="auto", help="processes generating the load (each with its share of "
                   "the concurrency); auto: one per 64 streams, at most half the CPUs")
    p.add_argument("--json-schema", default=None, help="every request asks for this JSON schema's answer "
                   "(JSON text or a file; chat and responses endpoints)")
    p.add_argument("--sweep", default=None, help="comma-separated concurrencies, e.g. 1,8,32,128,256 "
                   "(each level sends min(--num-requests, max(16, 4 x concurrency)) requests)")


def config_from_args(args: argparse.Namespace) -> LoadConfig:
    return LoadConfig(base_url=args.base_url.rstrip("/"), model=args.model, endpoint=args.endpoint,
                      num_requests=args.num_requests, concurrency=args.concurrency,
                      request_rate=args.request_rate, max_tokens=args.max_tokens, ignore_eos=args.ignore_eos,
                      dataset=args.dataset, prompt=args.prompt, input_len=args.input_len, seed=args.seed,
                      timeout=args.timeout, api_key=args.api_key, json_schema=load_schema(args.json_schema))


def print_summary(console: Console, s: dict[str, Any], title: str) -> None:
    t = Table(title=title, show_header=False)
    t.add_row("duration (s)", f"{s['duration_s']:.2f}")
    t.add_row("completed / failed", f"{s['completed']} / {s['failed']}")
    t.add_row("request throughput (req/s)", f"{s['request_throughput']:.2f}")
    t.add_row("output token throughput (tok/s)", f"{s['output_throughput']:.1f}")
    t.add_row("total token throughput (tok/s)", f"{s['total_token_throughput']:.1f}")
    for key, name in (("ttft_ms", "TTFT"), ("first_event_ms", "first event"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL"),
                      ("e2el_ms", "E2E latency")):
        v = s[key]
        t.add_row(f"{name} ms mean / p50 / p90 / p99",
                  f"{v['mean']:.1f} / {v['p50']:.1f} / {v['p90']:.1f} / {v['p99']:.1f}")
    for e in s["errors"]:
        t.add_row("error", e[:100])
    console.print(t)


def run_one(cfg: LoadConfig, console: Console, workers: str = "1") -> dict[str, Any]:
    n = auto_workers(cfg.concurrency) if workers == "auto" else max(1, int(workers))
    with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as progress:
        task = progress.add_task(f"c={cfg.concurrency}", total=cfg.num_requests)
        if n > 1:
            records, duration = run_load_in_processes(cfg, n, lambda: progress.advance(task))
        else:
            records, duration = asyncio.run(run_load(cfg, on_done=lambda r: progress.advance(task)))
    summary = summarize(records, duration)
    print_summary(console, summary, f"{cfg.endpoint} @ {cfg.base_url}, concurrency {cfg.concurrency}"
                  + (f", {n} load processes" if n > 1 else ""))
    return {"concurrency": cfg.concurrency, "workers": n, "summary": summary, "records": records_json(records)}


def run_bench_serve(args: argparse.Namespace) -> int:
    from osserve.bench.plot import plot_run, plot_sweep

    console = Console()
    base = config_from_args(args)
    levels = [int(c) for c in args.sweep.split(",")] if args.sweep else [base.concurrency]
    runs = []
    try:
        for c in levels:
            # A sweep sends 4 requests per concurrency slot (at least 16, at most --num-requests),
            # so low concurrencies finish in reasonable time and high ones reach steady state.
            n = min(base.num_requests, max(16, 4 * c)) if args.sweep else base.num_requests
            runs.append(run_one(replace(base, concurrency=c, num_requests=n), console, args.workers))
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: writing what was measured[/yellow]")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"config": asdict(base), "runs": runs}, f, indent=1)
    if args.plot and runs:
        if len(runs) > 1:
            plot_sweep(runs, args.plot, f"{base.model}: throughput vs TTFT")
        else:
            from osserve.bench.stats import RequestRecord

            recs = [RequestRecord(**r) for r in runs[0]["records"]]
            plot_run(recs, runs[0]["summary"]["duration_s"], args.plot, f"{base.model}, c={levels[0]}")
    return 0 if runs and all(r["summary"]["failed"] == 0 for r in runs) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="osserve-bench-serve")
    add_bench_serve_parser(parser.add_subparsers(dest="cmd", required=True))
    return run_bench_serve(parser.parse_args(["serve", *(argv if argv is not None else sys.argv[1:])]))


if __name__ == "__main__":
    sys.exit(main())
