"""`osserve serve | generate | chat | checkpoint | bench | tools` — argument parsing only; each command's
work lives in its own module, imported when the command runs (so `osserve --help` is instant)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from osserve.config import PRESETS


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Model and engine flags shared by serve, generate and bench (names as vLLM users know them)."""
    p.add_argument("--model", default=None,
                   help="checkpoint folder (config.json + safetensors); default: the built-in model")
    p.add_argument("--load-format", choices=("auto", "dummy"), default="auto",
                   help="dummy: random weights of --preset's shapes, made on the device (no disk)")
    p.add_argument("--preset", choices=PRESETS, default=None, help="shapes for --load-format dummy")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--dtype", choices=("auto", "bfloat16", "float32"), default="auto")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--admission-delay-ms", type=float, default=0.0,
                   help="while requests decode, let newcomers gather this long (or 32 of them) before a "
                        "prefill joins the batch: more decode-only (CUDA-graph) steps, a little more TTFT")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.90)
    p.add_argument("--kv-cache-gb", type=float, default=None, help="KV-cache budget (CPU)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    p.add_argument("--no-mixed-graphs", action="store_true",
                   help="no CUDA graphs for steps that mix new prompts with decodes (they run eagerly)")
    p.add_argument("--no-async-scheduling", action="store_true",
                   help="finish each step before scheduling the next (no host/GPU overlap)")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="osserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    ck = sub.add_parser("checkpoint", help="write a random-weight checkpoint in the HF layout")
    ck.add_argument("--preset", choices=PRESETS, required=True)
    ck.add_argument("--out", required=True)
    ck.add_argument("--seed", type=int, default=0)

    gen = sub.add_parser("generate", help="render a harmony prompt, decode, print reasoning and answer")
    add_engine_args(gen)
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--reasoning-effort", choices=("low", "medium", "high"), default="medium")

    srv = sub.add_parser("serve", help="the OpenAI- and Ollama-compatible HTTP server")
    add_engine_args(srv)
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=8000)
    srv.add_argument("--served-model-name", default=None)
    srv.add_argument("--api-key", default=None)
    srv.add_argument("--max-waiting", type=int, default=None, help="queue bound; beyond it 503")
    srv.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=None,
                     help="run the engine's step loop in a process of its own, sharing no GIL with the HTTP "
                          "server (default: yes on a GPU, no on a CPU)")
    srv.add_argument("--api-server-count", type=int, default=None,
                     help="HTTP server processes in front of the one engine process, sharing the port "
                          "(default: 2 with the engine in a process of its own, else 1)")
    srv.add_argument("--showcase", action="store_true",
                     help="once up, send the demo model a question and a tool round trip, and print them")

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    lat = bench_sub.add_parser("latency", help="offline batch latency/throughput")
    add_engine_args(lat)
    lat.add_argument("--batch-size", type=int, default=1)
    lat.add_argument("--input-len", type=int, default=1024)
    lat.add_argument("--output-len", type=int, default=512)
    lat.add_argument("--warmup", type=int, default=1)
    lat.add_argument("--repeats", type=int, default=3)
    lat.add_argument("--output-json", default=None)
    try:
        from osserve.bench.serve import add_bench_serve_parser
    except ImportError:  # the load generator is optional at this layer
        pass
    else:
        add_bench_serve_parser(bench_sub)
    from osserve.commands.tools import add_tools_parser

    add_tools_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "checkpoint":
        from osserve.config import preset
        from osserve.model.checkpoint import write_checkpoint

        out = write_checkpoint(preset(args.preset), args.out, seed=args.seed)
        print(f"wrote {args.preset} checkpoint to {out}")
        return 0
    if args.command == "generate":
        from osserve.commands.generate import run_generate

        return run_generate(args)
    if args.command == "serve":
        from osserve.server.run import run_server

        return run_server(args)
    if args.command == "bench" and args.bench_command == "latency":
        from osserve.bench.latency import run_bench_latency

        return run_bench_latency(args)
    if args.command == "tools":
        from osserve.commands.tools import run_tools_command

        return run_tools_command(args)
    if args.command == "bench" and args.bench_command == "serve":
        from osserve.bench.serve import run_bench_serve

        return run_bench_serve(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
