"""Where the HTTP server process's time goes under a serving load, without a model or a GPU.

    python3 benchmarks/profile_http.py [--step-ms 15] [--concurrency 256] [--num-requests 1024]

The server is the real one (create_app + uvicorn) over the real ProcessEngine, whose child runs
`stepping_engine_main` instead of a model: every --step-ms it sends one token to each running
request, as the engine does at a decode step, through the same pipe. `osserve bench serve` loads
it from another process (chat endpoint, streaming, ignore_eos). The server runs under cProfile:
at the end the tokens per second it delivered, its CPU seconds per 1000 tokens and its busiest
functions are printed. If the server keeps up, the delivered rate is the engine's
(concurrency / step); if it falls behind, chunks coalesce and TTFT grows.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import resource
import subprocess
import sys
import threading
import time

from osserve.engine.core.outputs import CompletionDelta, EngineStats
from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.load import EngineArgs
from osserve.engine.process_engine import ServerLinks

PORT = 8011


def stepping_engine_main(args: EngineArgs, links: ServerLinks) -> None:
    """A model-free engine loop: one token per running request every args.seed milliseconds (the
    step period rides in `seed`, the one integer EngineArgs has to spare)."""
    from osserve.tokenizer import load_tokenizer

    tok = load_tokenizer()
    words = tok.encode(" the quantum state of a particle is described by a wave function")
    links.announce(("ready", {"max_model_len": 4096, "max_waiting": 10_000}))
    running: dict[str, tuple[int, SamplingParams, int]] = {}  # rid -> (prompt len, params, tokens out)
    period = args.seed / 1000
    generated = 0
    next_step = time.monotonic()
    while True:
        for msg in links.receive(0 if running else 0.5):
            if msg[0] == "stop":
                return
            if msg[0] == "add":
                running[msg[1]] = (len(msg[2]), msg[3], 0)
            elif msg[0] == "abort":
                running.pop(msg[1], None)
        if not running:
            next_step = time.monotonic()
            continue
        deltas = []
        for rid, (prompt_len, params, n) in list(running.items()):
            t = words[n % len(words)]
            n += 1
            last = n >= (params.max_tokens or 16)
            deltas.append(CompletionDelta(rid, [t], tok.decode([t]), None, last, "length" if last else None,
                                          None, prompt_len, 0, n))
            running[rid] = (prompt_len, params, n)
            if last:
                del running[rid]
        generated += len(deltas)
        links.send(deltas, EngineStats(num_running=len(running), generation_tokens_total=generated))  # type: ignore[arg-type]
        next_step += period
        time.sleep(max(0.0, next_step - time.monotonic()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--step-ms", type=int, default=15)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--num-requests", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--client-profile", default=None, help="also profile the load generator into this file")
    ap.add_argument("--no-profile", action="store_true", help="the server without cProfile (its own speed)")
    ap.add_argument("--loop", default="auto", help="uvicorn's event loop: auto (uvloop if installed), asyncio")
    ap.add_argument("--http", default="auto", help="uvicorn's HTTP parser: auto (httptools if installed), h11")
    ap.add_argument("--api-servers", type=int, default=1,
                    help="above 1: that many server processes (server/api_servers.py), not profiled")
    args = ap.parse_args()
    if args.api_servers > 1:
        load_api_servers(args)
        return

    import uvicorn

    from osserve.engine.process_engine import ProcessEngine
    from osserve.server.app import ServerConfig, create_app

    engine = ProcessEngine.start(EngineArgs(seed=args.step_ms), engine_main=stepping_engine_main)
    app = create_app(engine, engine.tokenizer, ServerConfig(model_name="stepping"))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=PORT, log_level="warning", loop=args.loop,
                                            http=args.http))
    load = load_command(args, args.client_profile)
    result: dict[str, float] = {}

    def drive() -> None:
        while not server.started:
            time.sleep(0.05)
        cpu0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        subprocess.run(load, check=True)
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        result["wall"] = time.perf_counter() - t0
        result["cpu"] = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
        server.should_exit = True

    threading.Thread(target=drive, daemon=True).start()
    profiler = cProfile.Profile()
    if not args.no_profile:
        profiler.enable()
    server.run()
    profiler.disable()
    engine.shutdown()
    tokens = args.num_requests * args.max_tokens
    print(f"server process: {result['cpu']:.1f} CPU s in {result['wall']:.1f} s wall for {tokens} tokens: "
          f"{1000 * result['cpu'] / tokens:.3f} CPU ms per token, {tokens / result['wall']:.0f} tok/s delivered "
          f"(engine offers {args.concurrency * 1000 / args.step_ms:.0f})"
          + ("" if args.no_profile else "; under cProfile"))
    if args.no_profile:
        return
    stats = pstats.Stats(profiler)
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(args.top)
    if args.client_profile:
        print("the load generator:")
        pstats.Stats(args.client_profile).sort_stats("tottime").print_stats(args.top)


def load_command(args: argparse.Namespace, profile_into: str | None = None) -> list[str]:
    profile_client = ["-m", "cProfile", "-o", profile_into] if profile_into else []
    return [sys.executable, *profile_client, "-m", "osserve.bench.serve", "--base-url", f"http://127.0.0.1:{PORT}",
            "--model", "stepping", "--endpoint", "chat", "--num-requests", str(args.num_requests),
            "--concurrency", str(args.concurrency), "--max-tokens", str(args.max_tokens), "--ignore-eos"]


def load_api_servers(args: argparse.Namespace) -> None:
    """The same load against --api-servers server processes in front of the stepping engine."""
    from osserve.server.api_servers import ApiServers, ServerSpec
    from osserve.server.app import ServerConfig

    spec = ServerSpec(ServerConfig(model_name="stepping"), "127.0.0.1", PORT, log_level="warning")
    with ApiServers(EngineArgs(seed=args.step_ms), args.api_servers, spec, engine_main=stepping_engine_main):
        t0 = time.perf_counter()
        subprocess.run(load_command(args), check=True)
        wall = time.perf_counter() - t0
    tokens = args.num_requests * args.max_tokens
    print(f"{args.api_servers} server processes: {tokens / wall:.0f} tok/s delivered "
          f"(engine offers {args.concurrency * 1000 / args.step_ms:.0f})")


if __name__ == "__main__":
    main()
