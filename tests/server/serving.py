"""Running an app on 127.0.0.1 in a background thread for tests, and waiting for a server process."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import uvicorn
from fastapi import FastAPI


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_healthy(proc: subprocess.Popen[str], base: str, timeout: float) -> None:
    """Until the server `proc` started answers GET /health with 200, it exits, or `timeout` s pass
    (the caller's next request says which)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.2)


@contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(base + "/v1/models", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.05)
    try:
        yield base
    finally:
        server.should_exit = True
        thread.join(timeout=10)
