"""Several HTTP server processes in front of one engine process: `osserve serve --api-server-count N`.

One HTTP process parses every request and streams every token: at 256 streams that is ~0.07 ms
of CPU a token (benchmarks/profile_http.py), and when one wave of requests ends and the next
arrives, the new ones queue on its single event loop while the engine waits for them. With N,
this process (the supervisor) starts the engine process and N server processes. Each binds the
same port with SO_REUSEPORT, so the kernel spreads connections over them, and talks to the
engine through pipes of its own (engine/process_engine.py). What they share goes through the
engine (its stats) or through files in one temporary directory: prometheus_client's
multiprocess mode for /metrics, SQLite for the Responses API's stored responses. The supervisor
stops everything when any of its processes exits, and on SIGINT or SIGTERM.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import shutil
import signal
import socket
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

from osserve.engine.process_engine import EngineMain, Link, ProcessEngine, _engine_main, start_engine_process
from osserve.errors import ConfigError
from osserve.server.metrics import METRICS_DIR_VARIABLE
from osserve.server.responses_store import ResponseStore

if TYPE_CHECKING:
    import argparse

    from osserve.engine.load import EngineArgs
    from osserve.server.app import ServerConfig

log = logging.getLogger("osserve")


def reuse_port_socket(host: str, port: int, listen: bool = True) -> socket.socket:
    """A socket on (host, port) that the other server processes' sockets share."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    if listen:
        sock.listen(2048)  # uvicorn's backlog
    return sock


def check_port_is_free(host: str, port: int) -> None:
    """SO_REUSEPORT lets a socket join another server's port (one of the same user) without a
    word: refuse a port that answers. One held by a socket without SO_REUSEPORT fails to bind."""
    try:
        socket.create_connection((host, port), timeout=1).close()
    except OSError:
        try:
            reuse_port_socket(host, port, listen=False).close()
        except OSError as e:
            raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror}", "port") from e
        return
    raise ConfigError(f"{host}:{port} is in use by another server", "port")


@dataclass(frozen=True)
class ServerSpec:
    """What a server process needs to build its app and listen."""

    config: ServerConfig
    host: str
    port: int
    max_waiting: int | None = None
    log_level: str = "info"
    access_log: bool = True  # False: --disable-log-requests


def _server_main(spec: ServerSpec, link: Link, info: dict[str, Any], ready: Event) -> None:
    import uvicorn

    from osserve.server.app import create_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    engine = ProcessEngine(link, info, spec.max_waiting)
    app = create_app(engine, engine.tokenizer, spec.config)
    # Listening already, so connections the kernel hands this process wait in its backlog until
    # the event loop runs.
    sock = reuse_port_socket(spec.host, spec.port)
    ready.set()
    try:
        uvicorn.Server(uvicorn.Config(app, log_level=spec.log_level, access_log=spec.access_log,
                                       timeout_graceful_shutdown=5)).run(
            sockets=[sock])
    finally:
        engine.shutdown()


class ApiServers:
    """The supervisor's processes: one engine, `count` HTTP servers, and the directory they share."""

    def __init__(self, engine_args: EngineArgs, count: int, spec: ServerSpec,
                 engine_main: EngineMain = _engine_main) -> None:
        """engine_main: the engine process's loop (tests pass one without a model)."""
        check_port_is_free(spec.host, spec.port)
        self.servers: list[BaseProcess] = []
        self.engine = start_engine_process(engine_args, count, engine_main)
        self.shared = tempfile.mkdtemp(prefix="osserve-")
        try:
            responses_db = os.path.join(self.shared, "responses.db")
            ResponseStore.create(responses_db)
            self._start_servers(replace(spec, config=replace(spec.config, responses_db=responses_db)))
        except BaseException:
            self.stop()
            raise

    def _start_servers(self, spec: ServerSpec) -> None:
        ctx = mp.get_context("spawn")
        metrics_dir = os.path.join(self.shared, "metrics")
        os.mkdir(metrics_dir)
        readies = []
        before = os.environ.get(METRICS_DIR_VARIABLE)
        os.environ[METRICS_DIR_VARIABLE] = metrics_dir  # a spawned process starts with this environment
        try:
            for i, link in enumerate(self.engine.links):
                ready = ctx.Event()
                process = ctx.Process(target=_server_main, args=(spec, link, self.engine.info, ready),
                                      name=f"osserve-api-{i}", daemon=True)
                process.start()
                self.servers.append(process)
                readies.append(ready)
        finally:
            if before is None:
                del os.environ[METRICS_DIR_VARIABLE]
            else:
                os.environ[METRICS_DIR_VARIABLE] = before
        # The servers hold their pipes now. Closed here, a server that exits is seen by the engine
        # (its pipe's end-of-file aborts its requests), and the last one to go stops the engine.
        for commands, outputs in self.engine.links:
            commands.close()
            outputs.close()
        for server, ready in zip(self.servers, readies, strict=True):
            while not ready.wait(0.1):
                if not server.is_alive():
                    raise RuntimeError(f"{server.name} exited with code {server.exitcode} before it was ready")

    def wait(self) -> int:
        """Until one of the processes exits; its exit code (1 if it had none to give)."""
        processes = {p.sentinel: p for p in [*self.servers, self.engine.process]}
        gone = processes[wait(list(processes))[0]]  # type: ignore[index]
        log.error("%s exited with code %s: stopping", gone.name, gone.exitcode)
        return gone.exitcode or 1

    def stop(self) -> None:
        for server in self.servers:
            if server.is_alive():
                server.terminate()  # uvicorn's graceful shutdown, up to 5 s
        for server in self.servers:
            server.join(timeout=10)
            if server.is_alive():
                server.kill()
                server.join()
        # With every server gone, the engine stops by itself; it is made to if it does not.
        self.engine.stop()
        shutil.rmtree(self.shared, ignore_errors=True)

    def __enter__(self) -> ApiServers:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()


def run_api_servers(args: argparse.Namespace, count: int, config: ServerConfig, announce: Callable[[], None]) -> int:
    """`osserve serve` with `count` (> 1) HTTP processes, until SIGINT / SIGTERM or a process's exit."""
    from osserve.engine.load import EngineArgs

    if args.engine_process is False:
        raise ConfigError("--api-server-count above 1 needs the engine in a process of its own", "engine_process")

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt  # SIGTERM stops as Ctrl-C does: through stop()

    signal.signal(signal.SIGTERM, interrupt)
    spec = ServerSpec(config, args.host, args.port, args.max_waiting,
                      access_log=not getattr(args, "disable_log_requests", False))
    with ApiServers(EngineArgs.from_namespace(args), count, spec) as servers:
        log.info("%d HTTP server processes in front of one engine process", count)
        announce()
        try:
            return servers.wait()
        except KeyboardInterrupt:
            return 0
