"""The stateful python session, as it runs inside the sandbox: a notebook-like loop over cells.

This file is run as a script (`python -I -c <this source> <config json>`) by session.py, inside
the namespaces and read-only root that sandbox.py builds; it imports the standard library only,
and nothing of osserve (osserve is not visible inside the sandbox).

Protocol: one JSON request a line on the request fd, `{"code": ..., "nonce": ...}`. Everything the
cell prints goes to fds 1 and 2, which are one pipe to the parent (stdout and stderr interleaved as
in a terminal). After the cell the worker writes `SENTINEL_START + nonce + " " + status +
SENTINEL_END` to fd 1, so the parent knows where this cell's output ends. Status is one of
ok, error, memory, cpu, interrupted.

As in a notebook: names persist between cells, and the value of a cell's last expression is
printed (its repr) when it is not None. A traceback shows the cell's own frames only. Unlike a
notebook, no process a cell starts outlives the cell (in the sandbox's own pid namespace): a fork
loop ends with its cell, and forked copies of this loop never answer a request.
"""

from __future__ import annotations

import ast
import json
import linecache
import os
import resource
import signal
import sys
import time
import traceback
from typing import Any

SENTINEL_START = "\x1eosserve-cell-end:"
SENTINEL_END = "\x1e\n"


class CpuTimeExceeded(BaseException):
    """Raised in the cell by SIGXCPU: a BaseException so that `except Exception` cannot eat it."""


def _on_sigxcpu(signum: int, frame: Any) -> None:
    raise CpuTimeExceeded


def apply_limits(limits: dict[str, int]) -> None:
    """Hard rlimits for this process and everything it starts: code in the cell cannot raise
    them (raising a hard limit needs CAP_SYS_RESOURCE in the first user namespace)."""
    pairs = {
        resource.RLIMIT_AS: limits["memory_bytes"],
        resource.RLIMIT_CPU: limits["session_cpu_seconds"],
        resource.RLIMIT_FSIZE: limits["max_file_bytes"],
        resource.RLIMIT_NOFILE: limits["max_open_files"],
        resource.RLIMIT_NPROC: limits["max_processes"],
        resource.RLIMIT_CORE: 0,
    }
    for which, value in pairs.items():
        resource.setrlimit(which, (value, value))


def arm_cpu_limit(cell_cpu_seconds: int) -> None:
    """Per cell: the soft CPU limit is the CPU used so far plus this cell's allowance. The kernel
    sends SIGXCPU there (handled: the cell stops, the session lives); the hard limit is the
    session's whole budget, where the kernel kills."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = int(usage.ru_utime + usage.ru_stime) + 1
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    resource.setrlimit(resource.RLIMIT_CPU, (min(hard, used + cell_cpu_seconds), hard))


def compile_cell(code: str, filename: str) -> tuple[Any, Any]:
    """(statements, last expression or None), compiled: a notebook prints its last expression."""
    tree = ast.parse(code, filename, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body[-1].value)
        tree.body.pop()
    body = compile(tree, filename, "exec")
    return body, (compile(last, filename, "eval") if last is not None else None)


def print_traceback(exc: BaseException, skip_frames: int) -> None:
    """The exception with the worker's own frames left out, as a notebook shows it."""
    tb = exc.__traceback__
    for _ in range(skip_frames):
        if tb is not None:
            tb = tb.tb_next
    if isinstance(exc, SyntaxError):
        lines = traceback.format_exception_only(type(exc), exc)
    else:
        lines = traceback.format_exception(type(exc), exc, tb)
    sys.stderr.write("".join(lines))


def run_cell(code: str, namespace: dict[str, Any], index: int) -> str:
    filename = f"<cell {index}>"
    # The traceback module reads source lines through linecache: register the cell's.
    linecache.cache[filename] = (len(code), None, code.splitlines(keepends=True), filename)
    try:
        try:
            body, last = compile_cell(code, filename)
        except SyntaxError as exc:
            print_traceback(exc, 0)
            return "error"
        exec(body, namespace)
        if last is not None:
            value = eval(last, namespace)
            if value is not None:
                print(repr(value))
        return "ok"
    except MemoryError as exc:
        print_traceback(exc, 1)
        return "memory"
    except CpuTimeExceeded:
        return "cpu"
    except KeyboardInterrupt as exc:
        print_traceback(exc, 1)
        return "interrupted"
    except SystemExit as exc:
        if exc.code not in (None, 0):
            sys.stderr.write(f"SystemExit: {exc.code}\n")
        return "ok"
    except BaseException as exc:
        print_traceback(exc, 1)
        return "error"


def kill_other_processes() -> None:
    """After a cell: kill whatever it started. kill(-1) reaches every process of the sandbox's
    pid namespace this uid may signal, except the caller and the namespace's init (which reaps
    orphans); our own children are reaped here. Repeated while a fork loop may still be making
    new ones, until nothing is left to signal."""
    for _ in range(50):
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            break
        while True:
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                break
    # Orphans killed above are the namespace init's to reap: wait (briefly) until they are gone, so
    # the next cell starts with nothing of this one left, on a busy host too.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and sum(p.isdigit() for p in os.listdir("/proc")) > 2:
        time.sleep(0.01)


def open_streams() -> tuple[Any, Any]:
    """Line-buffered text streams on fds 1 and 2 (one pipe to the parent)."""
    return (open(1, "w", encoding="utf-8", errors="replace", buffering=1, closefd=False),
            open(2, "w", encoding="utf-8", errors="replace", buffering=1, closefd=False))


def main() -> None:
    config = json.loads(sys.argv[1])
    apply_limits(config["limits"])
    signal.signal(signal.SIGXCPU, _on_sigxcpu)
    # The cell reads nothing from stdin (the parent talks on the request fd only).
    stdin_fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin_fd, 0)
    streams = open_streams()
    requests = open(config["request_fd"], encoding="utf-8", closefd=True)
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
    # SIGINT (the parent's timeout) interrupts a cell; between cells it must not end the session.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.write(1, f"{SENTINEL_START}{config['ready_nonce']} ready{SENTINEL_END}".encode())
    worker_pid = os.getpid()
    for index, line in enumerate(requests, start=1):
        request = json.loads(line)
        if any(stream.closed for stream in streams):  # a cell closed them
            streams = open_streams()
        sys.stdout, sys.stderr = streams  # a cell may have replaced them
        try:
            arm_cpu_limit(config["limits"]["cell_cpu_seconds"])
            signal.signal(signal.SIGINT, signal.default_int_handler)
            status = run_cell(request["code"], namespace, index)
        except CpuTimeExceeded:  # the signal landed between the cell and here
            status = "cpu"
        except KeyboardInterrupt:
            status = "interrupted"
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass  # the cell closed or broke its own stream; the marker goes out below anyway
        if os.getpid() != worker_pid:
            os._exit(0)  # a process the cell forked came back here: it is not the session
        if config["own_pid_namespace"]:
            kill_other_processes()  # no process outlives its cell (a fork bomb ends here)
        os.write(1, f"{SENTINEL_START}{request['nonce']} {status}{SENTINEL_END}".encode())

if __name__ == "__main__":
    main()
