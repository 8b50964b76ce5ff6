"""The HTTP app: `create_app(engine, tokenizer, config)` wires the routes, errors, auth, body
limit and metrics around any EngineClient (the real AsyncEngine, or a test stub), and starts the
tools the Responses API runs (`--tool-server`) with the app, in its own event loop: each HTTP
process (api_servers.py) has tools of its own."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from osserve import __version__
from osserve.engine.core.outputs import EngineClient
from osserve.model.card import ModelCard
from osserve.server import chat, completions, ollama
from osserve.server.errors import error_response, install_error_handlers
from osserve.server.generation import ServerState
from osserve.server.metrics import ServerMetrics
from osserve.server.responses import route as responses
from osserve.server.responses_store import ResponseStore
from osserve.tokenizer import Tokenizer
from osserve.tools.registry import ToolServerOptions, ToolServers

OPEN_PATHS = ("/health", "/metrics", "/docs", "/openapi.json", "/api/version")


@dataclass(frozen=True)
class ServerConfig:
    model_name: str = "osserve-builtin"
    api_key: str | None = None
    max_body_bytes: int = 8 * 2**20
    max_stored_responses: int = 1024
    responses_db: str = ":memory:"  # a file when several server processes share it (api_servers.py)
    model_card: ModelCard | None = None  # what /api/show, /api/tags and /api/ps tell of the model
    stream_interval: int = 1  # tokens per streamed chunk (vLLM's --stream-interval); the first comes at once
    tool_servers: str | None = None  # --tool-server: demo, browser, python, MCP server URLs (comma-separated)
    tool_options: ToolServerOptions | None = None  # the tools' limits, backend, allowed MCP URLs

    @property
    def runs_tools(self) -> bool:
        return self.tool_servers is not None or bool(self.tool_options and self.tool_options.allowed_server_urls)


class _Guard:
    """API key (401) and request body size (413) before any route runs.

    A plain ASGI middleware, not Starlette's BaseHTTPMiddleware: that one passes every chunk of a
    streamed response through a memory stream and a task switch: removing it halved the HTTP
    process's CPU time per streamed token at 256 streams (benchmarks/profile_http.py, 0.128 ->
    0.062 ms under cProfile). Here a request that passes is handed on untouched."""

    def __init__(self, app: ASGIApp, config: ServerConfig) -> None:
        self.app = app
        self.config = config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (refused := self._refusal(scope)) is not None:
            await refused(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> Response | None:
        headers = Headers(scope=scope)
        length = headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.config.max_body_bytes:
            return error_response(413, f"request body larger than {self.config.max_body_bytes} bytes",
                                  "invalid_request_error")
        key = self.config.api_key
        if key and not scope["path"].startswith(OPEN_PATHS):
            if headers.get("authorization", "") != f"Bearer {key}":
                return error_response(401, "missing or wrong API key (Authorization: Bearer ...)",
                                      "authentication_error", code="invalid_api_key")
        return None


def create_app(engine: EngineClient, tokenizer: Tokenizer, config: ServerConfig) -> FastAPI:
    state = ServerState(engine=engine, tokenizer=tokenizer, model_name=config.model_name,
                        metrics=ServerMetrics(engine.stats, config.model_name),
                        responses=ResponseStore(config.max_stored_responses, config.responses_db),
                        api_key=config.api_key, stream_interval=config.stream_interval)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        """The tools live in the serving event loop (python sessions are its subprocesses)."""
        if config.runs_tools:
            state.tools = await ToolServers.start(config.tool_servers, config.tool_options)
        try:
            yield
        finally:
            await state.tool_states.close()
            if state.tools is not None:
                await state.tools.close()

    app = FastAPI(title="osserve", version=__version__, lifespan=lifespan,
                  description="OpenAI- and Ollama-compatible server for gpt-oss")
    app.state.osserve = state
    app.state.model_card = config.model_card
    app.add_middleware(_Guard, config=config)
    install_error_handlers(app)
    for module in (chat, completions, responses, ollama):
        app.include_router(module.router)
    started = int(time.time())

    @app.get("/health")
    async def health() -> Response:
        if not engine.is_ready:
            return error_response(503, "the engine is not ready", "unavailable")
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models() -> Any:
        return {"object": "list", "data": [{"id": config.model_name, "object": "model", "created": started,
                                            "owned_by": "osserve", "max_model_len": engine.max_model_len}]}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    return app
