"""Running the server from the command line: the tools checked, the engine (in this process, or
its own), one HTTP process or several before it (api_servers.py), the start-up banner and the
showcase."""

from __future__ import annotations

import argparse
import asyncio
import logging
import threading
import time
from typing import TYPE_CHECKING

from osserve import __version__
from osserve.errors import ConfigError
from osserve.model.card import ModelCard, model_card
from osserve.model.resolve import resolve_model
from osserve.server.app import ServerConfig, create_app

if TYPE_CHECKING:
    import uvicorn

    from osserve.engine.core.outputs import EngineClient
    from osserve.tools.registry import ToolServerOptions

log = logging.getLogger("osserve")

DEAD_ENGINE_GRACE_S = 2.0


def run_server(args: argparse.Namespace) -> int:
    import uvicorn

    from osserve.engine.async_engine import build_async_engine, engine_in_own_process

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    name, card = served_model(args)
    config = ServerConfig(model_name=name, api_key=args.api_key, model_card=card,
                          stream_interval=getattr(args, "stream_interval", 1),
                          tool_servers=getattr(args, "tool_server", None),
                          tool_options=_tool_options(args))
    if config.runs_tools:
        check_tools(config)  # before the engine loads: a tool that cannot start stops the server now
    count = args.api_server_count
    # On a GPU one HTTP process falls behind the engine: 20b served 18,084.2 / 18,760.9 tok/s with one,
    # 22,177.4 / 21,550.2 with two (H100, 2026-11-24, one call; BENCHMARKS.md, the 20b serving row).
    if count is None:
        count = 2 if engine_in_own_process(args) else 1
    if count < 1:
        raise ConfigError("--api-server-count must be at least 1", "api_server_count")
    if count > 1:
        from osserve.server.api_servers import run_api_servers

        return run_api_servers(args, count, config, lambda: _announce(args, name))
    engine = build_async_engine(args)
    app = create_app(engine, engine.tokenizer, config)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="info",
                                           access_log=not getattr(args, "disable_log_requests", False)))
    died = threading.Event()
    threading.Thread(target=_stop_when_the_engine_dies, args=(engine, server, died), name="osserve-engine-watch",
                     daemon=True).start()
    _announce(args, name)
    try:
        server.run()
    finally:
        engine.shutdown()
    return 1 if died.is_set() else 0


def _stop_when_the_engine_dies(engine: EngineClient, server: uvicorn.Server, died: threading.Event) -> None:
    """A server whose engine has died (a failed step, a tensor-parallel rank gone) answers 503 and
    fails its open requests (the engine clients do both); DEAD_ENGINE_GRACE_S later it exits, with
    code 1, for whatever supervises it to restart it. (Several HTTP processes: their supervisor
    stops them all when the engine process exits, api_servers.py.)"""
    while not server.should_exit:
        if not engine.is_ready:
            log.error("the engine stopped: answering 503 for %.0f s, then exiting", DEAD_ENGINE_GRACE_S)
            died.set()
            time.sleep(DEAD_ENGINE_GRACE_S)  # clients and balancers see 503s, not a closed port
            server.should_exit = True
            return
        time.sleep(0.5)


def _tool_options(args: argparse.Namespace) -> ToolServerOptions | None:
    if not hasattr(args, "tool_call_timeout"):
        return None
    from osserve.commands.tools import tool_server_options

    return tool_server_options(args)


def check_tools(config: ServerConfig) -> None:
    """Starts the tools once and stops them: an unreachable MCP server, an unknown name or a python
    tool that cannot be isolated is a ToolSetupError naming it (the command prints it, exit 1).
    Each HTTP process then starts tools of its own (app.py)."""
    from osserve.tools.registry import ToolServers

    async def start_and_stop() -> list[str]:
        servers = await ToolServers.start(config.tool_servers, config.tool_options)
        try:
            return list(servers.namespaces())
        finally:
            await servers.close()

    names = asyncio.run(start_and_stop())
    allowed = config.tool_options.allowed_server_urls if config.tool_options else ()
    log.info("tools for the Responses API: %s%s", ", ".join(names) or "none",
             f"; MCP URLs a request may name: {', '.join(allowed)}" if allowed else "")


def served_model(args: argparse.Namespace) -> tuple[str, ModelCard]:
    """The served name and what the Ollama routes tell of the model. A Hugging Face id is resolved
    here, before any process starts (cache first, then the Hub: model/resolve.py), and the engine is
    handed the folder; the name defaults to the id (vLLM's rule) or the folder's name."""
    from osserve.config import ModelConfig, preset
    from osserve.engine.load import builtin_model_dir, resolve_device

    on_gpu = resolve_device(args.device).type == "cuda"
    if args.load_format == "dummy":
        if args.preset is None:
            raise ConfigError("--load-format dummy needs --preset tiny|20b|120b")
        return args.served_model_name or f"gpt-oss-{args.preset}", model_card(preset(args.preset), None, on_gpu)
    if args.model is None:
        from osserve.demo.weights import BUILTIN_NAME

        folder, name = builtin_model_dir(), BUILTIN_NAME
    else:
        resolved = resolve_model(args.model, getattr(args, "revision", None), getattr(args, "download_dir", None))
        log.info("model %s: %s (%s)", args.model, resolved.path, resolved.source)
        folder, name, args.model = resolved.path, resolved.name, str(resolved.path)
    return args.served_model_name or name, model_card(ModelConfig.from_pretrained(folder), folder, on_gpu)


def _announce(args: argparse.Namespace, name: str) -> None:
    """Once the server is up: how to call it, and the showcase if asked for."""
    base = f"http://{args.host}:{args.port}"
    print(f"""
osserve {__version__} serving '{name}' at {base}  (OpenAI: {base}/v1, Ollama: {base}/api)

  curl {base}/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{{"model": "{name}", "messages": [{{"role": "user", "content": "What is 2+2?"}}], "max_tokens": 64}}'

  python -c "from openai import OpenAI; c = OpenAI(base_url='{base}/v1', api_key='{args.api_key or 'none'}'); \\
r = c.chat.completions.create(model='{name}', max_tokens=64, messages=[{{'role': 'user', 'content': 'Hi'}}]); \\
print(r.choices[0].message)"
""", flush=True)
    if getattr(args, "showcase", False):
        threading.Thread(target=_showcase, args=(base, name, args.api_key), daemon=True).start()


def _showcase(base: str, name: str, api_key: str | None) -> None:
    from osserve.demo.showcase import run_showcase, wait_until_up

    try:
        wait_until_up(base)
        run_showcase(base, name, api_key)
    except Exception as exc:  # a showcase failure must not take the server down; say it instead
        logging.getLogger("osserve").warning("showcase failed: %s", exc)
