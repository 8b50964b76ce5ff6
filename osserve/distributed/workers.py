"""The worker processes (ranks 1..N-1), seen from the engine's process (rank 0).

Each is `python -m osserve.distributed.worker FD` (worker.py), started with subprocess rather than
multiprocessing: the engine may run in a daemonic process of its own (engine/process_engine.py),
and multiprocessing forbids those children. Each talks to the engine over one socket pair: its
WorkerSpec and then every step go down; "ready", or an "error" with its traceback, come up.

A thread watches the sockets. A worker's error, or its exit (the socket's end of file), is a
failure: the others are stopped (their next collective would wait forever for the dead rank), the
callbacks run (parallel_runner.py frees rank 0 from a collective in flight), and every later send
raises EngineDeadError, which the engine's front ends turn into failed requests and a 503.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from multiprocessing.util import Finalize
from pathlib import Path
from typing import cast

import torch

from osserve.distributed.layout import ParallelConfig
from osserve.distributed.messages import STOP, WorkerSpec
from osserve.errors import ConfigError, EngineDeadError

log = logging.getLogger("osserve")

STOP_WAIT_S = 10.0  # for a worker to exit after STOP, before it is terminated


def rank_devices(device: torch.device, parallel: ParallelConfig) -> list[torch.device]:
    """Each rank's device: GPUs index, index + 1, ... (ConfigError where too few are visible);
    on the CPU, or with parallel.one_device, the same device for all."""
    n = parallel.size
    if device.type != "cuda":
        return [device] * n
    first = device.index or 0
    if parallel.one_device:
        return [torch.device("cuda", first)] * n
    visible = torch.cuda.device_count()
    if first + n > visible:
        shown = os.environ.get("CUDA_VISIBLE_DEVICES")
        raise ConfigError(f"--tensor-parallel-size {n} needs {n} GPUs from cuda:{first}; {visible} "
                          f"{'is' if visible == 1 else 'are'} visible"
                          + (f" (CUDA_VISIBLE_DEVICES={shown})" if shown is not None else ""), "tensor_parallel_size")
    return [torch.device("cuda", first + r) for r in range(n)]


class WorkerPool:
    """Ranks 1..N-1: started by the constructor, each building its part of the model at once."""

    def __init__(self, specs: list[WorkerSpec]) -> None:
        self.failure: str | None = None  # why a rank failed, once one has
        self._callbacks: list[Callable[[str], None]] = []
        self._lock = threading.Lock()
        self._ready: set[int] = set()
        self._settled = threading.Event()  # every worker ready, or one failed
        self._failed = threading.Event()
        self._closing = False
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self._conns: dict[int, Connection] = {}
        for spec in specs:
            self.processes[spec.rank], self._conns[spec.rank] = _spawn(spec)
        # Stopped at exit, also of a multiprocessing child (the engine process), which runs no atexit.
        self._finalizer = Finalize(self, self.shutdown, exitpriority=10)
        self._watcher = threading.Thread(target=self._watch, name="osserve-rank-watch", daemon=True)
        self._watcher.start()

    @property
    def pids(self) -> dict[int, int]:
        return {rank: p.pid for rank, p in self.processes.items()}

    def on_failure(self, callback: Callable[[str], None]) -> None:
        """callback(reason) runs once, in the watching thread, when a rank fails (at once where one
        has failed already)."""
        with self._lock:
            self._callbacks.append(callback)
            failure = self.failure
        if failure is not None:
            callback(failure)

    def wait_ready(self) -> None:
        """Until every worker has built its rank; EngineDeadError where one failed instead."""
        self._settled.wait()
        self.raise_if_failed()

    def raise_if_failed(self) -> None:
        if self.failure is not None:
            raise EngineDeadError(f"a tensor-parallel rank failed: {self.failure}")

    def wait_for_failure(self, timeout: float) -> bool:
        """Whether a failure is known within `timeout` s (an error seen by rank 0's collective may
        reach it before the watcher sees the worker's exit)."""
        return self._failed.wait(timeout)

    def send(self, blob: bytes) -> None:
        """One message to every worker."""
        self.raise_if_failed()
        for rank, conn in self._conns.items():
            try:
                conn.send_bytes(blob)
            except OSError as e:
                self._fail(f"rank {rank} is gone ({e})")
                self.raise_if_failed()

    def shutdown(self) -> None:
        """Stop the workers: STOP, then terminate those that do not exit."""
        if self._closing:
            return
        self._closing = True
        for conn in self._conns.values():
            try:
                conn.send_bytes(STOP)
            except OSError:
                pass  # gone already
        for proc in self.processes.values():
            try:
                proc.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
        _kill_all(list(self.processes.values()))
        for conn in self._conns.values():
            conn.close()
        self._finalizer.cancel()

    # ------------------------------------------------------------------ the watching thread
    def _watch(self) -> None:
        open_conns = {conn: rank for rank, conn in self._conns.items()}
        while open_conns:
            try:
                readable = wait(list(open_conns))
            except (OSError, ValueError):  # closed under us by shutdown
                return
            for ready in readable:
                conn = cast(Connection, ready)
                rank = open_conns[conn]
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    del open_conns[conn]
                    if not self._closing:
                        code = self.processes[rank].poll()
                        self._fail(f"rank {rank} (pid {self.processes[rank].pid}) exited"
                                   + (f" with code {code}" if code is not None else ""))
                    continue
                if msg[0] == "ready":
                    self._ready.add(rank)
                    if len(self._ready) == len(self._conns):
                        self._settled.set()
                elif msg[0] == "error":
                    self._fail(f"rank {rank}: {msg[1]}")

    def _fail(self, reason: str) -> None:
        with self._lock:
            if self.failure is not None or self._closing:
                return
            self.failure = reason
        self._failed.set()
        log.error("tensor parallelism: %s; stopping the other ranks", reason)
        self._settled.set()
        with self._lock:
            callbacks = list(self._callbacks)
        for callback in callbacks:  # first: rank 0 may be waiting in a collective
            callback(reason)
        _kill_all(list(self.processes.values()))


def _spawn(spec: WorkerSpec) -> tuple[subprocess.Popen[bytes], Connection]:
    """One worker process and the engine's end of its socket pair; the spec goes down first."""
    ours, theirs = socket.socketpair()
    env = dict(os.environ)
    # The child imports osserve from where this process did (a checkout on sys.path, say).
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen([sys.executable, "-m", "osserve.distributed.worker", str(theirs.fileno())],
                            pass_fds=(theirs.fileno(),), env=env)
    theirs.close()
    conn = Connection(ours.detach())
    conn.send(spec)
    return proc, conn


def _kill_all(processes: list[subprocess.Popen[bytes]]) -> None:
    for proc in processes:
        if proc.poll() is None:
            proc.terminate()
    for proc in processes:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
