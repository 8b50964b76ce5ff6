"""A real MCP server for tests: the official SDK's MCPServer with tools that add, raise and hang,
served over streamable HTTP and over SSE by uvicorn on 127.0.0.1, each on a port of its own."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import uvicorn
from pydantic import Field  # at module level: the SDK reads the tools' annotations in this module's globals


def make_server() -> Any:
    """Tools whose arguments a random-weight model, forced to call them, can write to the end:
    `square` and `fail` take bounded arguments (a forced call's grammar follows the schema)."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("calc server", instructions="Arithmetic on integers.")

    @server.tool()
    def add(a: int, b: int, note: str | None = None) -> int:
        """Add two integers."""
        return a + b

    @server.tool()
    def square(n: Annotated[int, Field(ge=0, le=99)]) -> int:
        """Square a small integer."""
        return n * n

    @server.tool()
    def fail(reason: Annotated[str, Field(max_length=8)]) -> str:
        """Always raises."""
        raise RuntimeError(f"failing on purpose: {reason}")

    @server.tool()
    async def hang() -> str:
        """Never answers in time."""
        await asyncio.sleep(30)
        return "late"

    return server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_mcp_server() -> Iterator[dict[str, str]]:
    """{"http": URL, "sse": URL} of one MCP server, while the block runs."""
    logging.getLogger("mcp").setLevel(logging.CRITICAL)
    server = make_server()
    running = []
    urls = {}
    for kind, app, path in (("http", server.streamable_http_app(), "/mcp"), ("sse", server.sse_app(), "/sse")):
        port = free_port()
        uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
        threading.Thread(target=uv.run, daemon=True).start()
        deadline = time.monotonic() + 20
        while not uv.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert uv.started
        running.append(uv)
        urls[kind] = f"http://127.0.0.1:{port}{path}"
    try:
        yield urls
    finally:
        for uv in running:
            uv.should_exit = True


class ConnectionCounter:
    """A plain TCP listener on 127.0.0.1 that counts the connections made to it (and answers
    none): where a test proves the server never connected somewhere."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.05)
        self.port = int(self.sock.getsockname()[1])
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()
