"""One stateful python session (a notebook kernel) in the sandbox, and what the model sees of a call.

A session is one worker process (worker.py) started lazily at its first call. Per call: the cell
goes to the worker; its output (stdout and stderr, interleaved) is read up to the cell's end marker
within the wall-time limit. At the limit the cell gets SIGINT (the session and its variables live
on, as a notebook's interrupt); if it does not stop within a grace period the whole process group
is killed (with the pid namespace, every process the code started) and the next call starts a new
session. Output is bounded while it is read: the head and the tail are kept, the middle counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from osserve.tools.python import worker
from osserve.tools.python.sandbox import (
    Isolation,
    SandboxLimits,
    code_environment,
    id_maps,
    sandbox_argv,
    write_id_maps,
)

log = logging.getLogger(__name__)

NO_OUTPUT = ("[WARN] No output available. Use print() to output anything to stdout to receive "
             "the output")  # the words of gpt-oss's reference python tool
MAX_CODE_BYTES = 1 << 20
START_TIMEOUT_S = 20.0
INTERRUPT_GRACE_S = 2.0
_START = worker.SENTINEL_START.encode()
_END = worker.SENTINEL_END.encode()


class SandboxStartError(OSError):
    """The sandboxed interpreter could not be started (setup output attached)."""


@dataclass
class BoundedOutput:
    """The first `head` and last `tail` bytes of a stream, and how many fell between."""

    head_limit: int
    tail_limit: int
    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)
    omitted: int = 0

    def add(self, data: bytes) -> None:
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        if len(self.tail) > self.tail_limit:
            cut = len(self.tail) - self.tail_limit
            self.omitted += cut
            del self.tail[:cut]

    def text(self) -> str:
        head = self.head.decode("utf-8", errors="replace")
        tail = self.tail.decode("utf-8", errors="replace")
        if self.omitted:
            return f"{head}\n[... output truncated: {self.omitted} bytes omitted ...]\n{tail}"
        return head + tail


@dataclass
class _Process:
    proc: asyncio.subprocess.Process
    requests: int  # write end of the request pipe
    root: Path  # the session's own host folder (the sandbox root is mounted on it, inside only)
    pending: bytearray = field(default_factory=bytearray)
    abandoned: bool = False  # a call was cancelled mid-cell: killed, to be reaped by the next one


class PythonSession:
    """A stateful python process for one conversation. `run` never raises for what the code
    does; it raises SandboxStartError only when no interpreter can be started at all."""

    def __init__(self, isolation: Isolation | None, limits: SandboxLimits) -> None:
        self.isolation = isolation
        self.limits = limits
        self._process: _Process | None = None
        self._lock = asyncio.Lock()
        self._cells = 0

    @property
    def alive(self) -> bool:
        process = self._process
        return process is not None and not process.abandoned and process.proc.returncode is None

    async def run(self, code: str) -> str:
        """Runs one cell; returns exactly the text the model is shown."""
        if len(code.encode("utf-8", errors="replace")) > MAX_CODE_BYTES:
            return f"[ERROR] The code is too long (at most {MAX_CODE_BYTES} bytes)."
        async with self._lock:
            if not self.alive:
                await self._stop()
                self._process = await self._start()
            process = self._process
            assert process is not None
            self._cells += 1
            nonce = secrets.token_hex(8)
            request = json.dumps({"code": code, "nonce": nonce}) + "\n"
            out = BoundedOutput(self.limits.max_output_chars * 3 // 4, self.limits.max_output_chars // 4)
            try:  # in a thread: a long cell may not fit the pipe at once
                await asyncio.to_thread(write_all, process.requests, request.encode())
            except OSError:
                await self._stop()
                return "[ERROR] The python session ended; run the code again to start a new one."
            try:
                status = await self._read_until(process, nonce, out, self.limits.wall_seconds)
                if status is None and process.proc.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.proc.pid, signal.SIGINT)
                    status = await self._read_until(process, nonce, out, INTERRUPT_GRACE_S)
                    if status == "interrupted":
                        status = "timeout-interrupted"
            except asyncio.CancelledError:
                # The caller gave up (a client went away): the cell must not run on unseen, and its
                # output must not land in the next call's. The next call reaps it and starts afresh.
                process.abandoned = True
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.proc.pid, signal.SIGKILL)
                raise
            return await self._report(process, status, out)

    async def _report(self, process: _Process, status: str | None, out: BoundedOutput) -> str:
        text = out.text()
        limits = self.limits
        notes = {
            "memory": f"[ERROR] Memory limit reached (the python process may use {limits.memory_bytes >> 20} MiB).",
            "cpu": f"[ERROR] CPU time limit of {limits.cpu_seconds} seconds exceeded; execution was stopped "
                   "(the session's variables are kept).",
            "timeout-interrupted": f"[ERROR] Execution timed out after {limits.wall_seconds:g} seconds and "
                                   "was interrupted (the session's variables are kept).",
        }
        if status is None:
            ended = process.proc.returncode is not None
            await self._stop()
            if ended:
                note = (f"[ERROR] The python process ended ({describe_exit(process.proc.returncode)}); "
                        "the next call starts a new session (earlier variables are lost).")
            else:
                note = (f"[ERROR] Execution timed out after {limits.wall_seconds:g} seconds; the python "
                        "session was stopped and the next call starts a new one (earlier variables are lost).")
            return f"{text.rstrip()}\n{note}" if text.strip() else note
        if status in notes:
            return f"{text.rstrip()}\n{notes[status]}" if text.strip() else notes[status]
        return text if text.strip() else NO_OUTPUT

    async def _read_until(self, process: _Process, nonce: str, out: BoundedOutput | None,
                          timeout: float) -> str | None:
        """Reads output into `out` up to the end marker carrying `nonce`; returns the status it
        names, or None at the time limit or at the end of the stream."""
        marker = _START + nonce.encode() + b" "
        stream = process.proc.stdout
        assert stream is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        buf = process.pending
        while True:
            at = buf.find(marker)
            if at >= 0 and (end := buf.find(_END, at)) >= 0:
                if out is not None:
                    out.add(bytes(buf[:at]))
                status = buf[at + len(marker):end].decode(errors="replace")
                process.pending = bytearray(buf[end + len(_END):])
                return status
            # Keep back only what could still be the start of the marker.
            keep = at if at >= 0 and len(buf) - at < len(marker) + 64 else max(0, len(buf) - len(marker))
            if out is not None:
                out.add(bytes(buf[:keep]))
            del buf[:keep]
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            try:
                chunk = await asyncio.wait_for(stream.read(1 << 16), remaining)
            except TimeoutError:
                return None
            if not chunk:
                if out is not None:
                    out.add(bytes(buf))
                buf.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(process.proc.wait(), 1.0)
                return None
            buf += chunk

    async def _start(self) -> _Process:
        limits = self.limits
        root = Path(tempfile.mkdtemp(prefix="osserve-python-"))
        ready = secrets.token_hex(8)
        request_r, request_w = os.pipe()
        go_r, go_w = os.pipe()
        isolated = self.isolation is not None and self.isolation.binaries is not None
        config = {"limits": limits.worker_limits(), "request_fd": request_r, "ready_nonce": ready,
                  "own_pid_namespace": isolated}
        worker_argv = [sys.executable, "-I", "-c", Path(worker.__file__).read_text(), json.dumps(config)]
        try:
            if self.isolation is not None and self.isolation.binaries is not None:
                maps, code_uid = id_maps()
                argv = sandbox_argv(self.isolation.binaries, root, go_r, limits, code_uid, worker_argv)
                env = code_environment(True, "/mnt/data")
                pass_fds: tuple[int, ...] = (request_r, go_r)
            else:
                argv, env, pass_fds, maps = worker_argv, code_environment(False, str(root)), (request_r,), {}
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, pass_fds=pass_fds, start_new_session=True, env=env,
                cwd=str(root))
        except BaseException:
            for fd in (request_r, request_w, go_r, go_w):
                os.close(fd)
            shutil.rmtree(root, ignore_errors=True)
            raise
        os.close(request_r)
        os.close(go_r)
        process = _Process(proc, request_w, root)
        try:
            if maps:
                await write_id_maps(proc.pid, maps)
                os.write(go_w, b"go\n")
            os.close(go_w)
            go_w = -1
            setup = BoundedOutput(4000, 4000)
            if await self._read_until(process, ready, setup, START_TIMEOUT_S) != "ready":
                raise SandboxStartError("the python sandbox did not start: " + (setup.text().strip()
                                        or describe_exit(proc.returncode)))
        except BaseException:
            if go_w >= 0:
                os.close(go_w)
            self._process = process
            await self._stop()
            raise
        return process

    async def _stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        with contextlib.suppress(OSError):
            os.close(process.requests)  # the worker ends at the end of its requests...
        if process.proc.returncode is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.proc.wait(), 0.5)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.proc.pid, signal.SIGKILL)  # ...or with its whole process group
        await process.proc.wait()
        shutil.rmtree(process.root, ignore_errors=True)

    async def close(self) -> None:
        async with self._lock:
            await self._stop()


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0 or returncode > 128:
        number = -returncode if returncode < 0 else returncode - 128
        with contextlib.suppress(ValueError):
            name = signal.Signals(number).name
            reason = {"SIGXCPU": ": CPU time limit", "SIGKILL": "", "SIGSEGV": ": crashed",
                      "SIGXFSZ": ": file size limit"}.get(name, "")
            return f"killed by {name}{reason}"
    return f"exit code {returncode}"
