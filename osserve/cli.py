"""`osserve serve | generate | chat | checkpoint | bench | tools` — argument parsing only; each command's
work lives in its own module, imported when the command runs (so `osserve --help` is instant)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from osserve import __version__
from osserve.commands.flags import add_engine_args, add_server_args, add_tools_args, prepare_argv, settle
from osserve.config import PRESETS
from osserve.errors import OsserveError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="osserve", description=__doc__)
    parser.add_argument("--version", action="version", version=f"osserve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    ck = sub.add_parser("checkpoint", help="write a random-weight checkpoint in the HF layout")
    ck.add_argument("--preset", choices=(*PRESETS, "eagle3"), required=True,
                    help="a gpt-oss shape, or eagle3: an EAGLE3 draft (SpecForge's layout) sized for --target")
    ck.add_argument("--target", default=None, metavar="MODEL",
                    help="with --preset eagle3: the gpt-oss checkpoint folder or Hugging Face id the draft serves")
    ck.add_argument("--out", required=True)
    ck.add_argument("--seed", type=int, default=0)

    gen = sub.add_parser("generate", help="render a harmony prompt, decode, print reasoning and answer")
    add_engine_args(gen)
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--reasoning-effort", choices=("low", "medium", "high"), default="medium")

    srv = sub.add_parser("serve", help="the OpenAI- and Ollama-compatible HTTP server",
                         usage="osserve serve [MODEL] [options]",
                         description="The OpenAI- and Ollama-compatible HTTP server. vLLM's and SGLang's gpt-oss "
                                     "recipe flags work as written, or are refused with the reason.")
    add_engine_args(srv)
    add_server_args(srv)
    add_tools_args(srv)

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
    lat.add_argument("--json-schema", default=None, help="every request's answer follows this JSON schema "
                     "(JSON text or a file): the cost of structured outputs")
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
    """The console script: a setting or model osserve cannot use is one line on stderr, no traceback."""
    try:
        return _main(argv)
    except OsserveError as e:
        print(f"osserve: error: {e.message}", file=sys.stderr)
        return 1


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse (vLLM's habits first: --config, underscores), then settle the model and refuse what
    osserve cannot honour; the notes on flags osserve always honours go to stderr."""
    args = build_parser().parse_args(prepare_argv(sys.argv[1:] if argv is None else argv))
    if hasattr(args, "model_tag"):
        for note in settle(args):
            print(f"osserve: note: {note}", file=sys.stderr)
    return args


def write_random_checkpoint(args: argparse.Namespace) -> int:
    from osserve.config import ModelConfig, preset

    if args.preset == "eagle3":
        from osserve.errors import ConfigError
        from osserve.model.eagle3_weights import write_random_draft
        from osserve.model.resolve import resolve_model

        if args.target is None:
            raise ConfigError("--preset eagle3 needs --target: the gpt-oss checkpoint the draft is for", "target")
        target = ModelConfig.from_pretrained(resolve_model(args.target).path)
        out = write_random_draft(target, args.out, seed=args.seed)
        print(f"wrote a random EAGLE3 draft for {args.target} to {out}")
        return 0
    from osserve.model.checkpoint import write_checkpoint

    out = write_checkpoint(preset(args.preset), args.out, seed=args.seed)
    print(f"wrote {args.preset} checkpoint to {out}")
    return 0


def _main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "checkpoint":
        return write_random_checkpoint(args)
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
