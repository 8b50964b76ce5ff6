"""ProcessEngine: the engine's step loop in its own process, for the server under load.

With the step loop in a thread (AsyncEngine), the engine and the HTTP server share one GIL: at
256 streams, each step's host work (scheduling, batch building, detokenising) is stretched by the
server's per-token work (harmony parsing, JSON, SSE writes) and the GPU waits. Here the engine
runs in a child process (spawned: CUDA cannot be forked) and talks to its HTTP server processes
(one, or several: server/api_servers.py) through two pipes each: requests and aborts go down,
each step's deltas (with an EngineStats snapshot) come up to the server that sent the request. A
reader thread in each server process hands the deltas to each request's asyncio.Queue.

A request the engine rejects (bad input, too long) comes back as a `rejected` message, raised as
the same typed osserve error from the first `anext` of `generate`, before any delta is yielded.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

from osserve import errors
from osserve.engine.core.outputs import CompletionDelta, EngineStats, Queues, coalesce, deliver, error_delta
from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.step_profile import ProfileLog
from osserve.errors import EngineDeadError, OsserveError, OverloadedError
from osserve.tokenizer import load_tokenizer

if TYPE_CHECKING:  # imported by the engine process only: an HTTP server process never loads torch
    from osserve.engine.load import EngineArgs

log = logging.getLogger("osserve")
# The engine process's GIL switch interval (_engine_main says why). OSSERVE_SWITCH_INTERVAL_S
# overrides it (read once at import), e.g. `OSSERVE_SWITCH_INTERVAL_S=0.005 bash
# benchmarks/structured_ab.sh` against the same without it.
SWITCH_INTERVAL_S = float(os.environ.get("OSSERVE_SWITCH_INTERVAL_S", 0.0002))
# The engine process's first-generation collection threshold (_engine_main says why; Python's is 700).
GC_THRESHOLD = 20_000


@dataclass
class _Rejected:
    """The engine refused a request: re-raised in the server as errors.<kind>(message, param)."""

    request_id: str
    kind: str
    message: str
    param: str | None

    @property
    def finished(self) -> bool:
        return True  # the request's last word: it leaves the queues (outputs.deliver)


# A step's outputs as they go up the pipe. Most deltas are plain (a token or so of a request that
# goes on, no logprobs): those travel as a tuple of the fields that vary, the rest as objects.
# Pickling 229 dataclasses per step took ~0.3 ms to write and ~0.6 ms to read back; tuples
# ~0.15 ms each way (with rebuilding the deltas).
_PlainDelta = tuple[str, list[int], str, int, int, int]
_Output = CompletionDelta | _Rejected | _PlainDelta


def pack_outputs(items: list[CompletionDelta | _Rejected]) -> list[_Output]:
    return [_pack(d) if isinstance(d, CompletionDelta) else d for d in items]


def _pack(d: CompletionDelta) -> _Output:
    if (d.finished or d.new_logprobs is not None or d.error is not None or d.queue_time is not None
            or d.finish_reason is not None or d.stop_reason is not None):
        return d
    return d.request_id, d.new_token_ids, d.new_text, d.num_prompt_tokens, d.num_cached_tokens, d.num_output_tokens


def unpack_output(item: _Output) -> CompletionDelta | _Rejected:
    if isinstance(item, tuple):
        rid, ids, text, num_prompt, num_cached, num_output = item
        return CompletionDelta(rid, ids, text, None, False, None, None, num_prompt, num_cached, num_output)
    return item


# ---------------------------------------------------------------------- the engine's side of the pipes
Link = tuple[Connection, Connection]  # one server's ends of its two pipes: commands, outputs


@dataclass
class ServerLinks:
    """The engine process's pipes to its HTTP server processes, each a (commands in, outputs out)
    pair. A request's outputs go back to the server that sent it. A server that hangs up has its
    requests aborted; when no server is left, the engine stops."""

    links: dict[int, Link]
    owner: dict[str, int] = field(default_factory=dict)  # request id -> the server that sent it

    def receive(self, timeout: float) -> list[tuple[Any, ...]]:
        """Every command waiting, after waiting up to `timeout` s for the first."""
        msgs: list[tuple[Any, ...]] = []
        ready = wait([commands for commands, _ in self.links.values()], timeout)
        for server, (commands, _) in list(self.links.items()):
            if commands not in ready:
                continue
            try:
                while commands.poll():
                    msg = commands.recv()
                    if msg[0] == "add":
                        self.owner[msg[1]] = server
                    msgs.append(msg)
            except EOFError:  # that server is gone: nobody would read its requests' outputs
                del self.links[server]
                msgs += [("abort", rid) for rid, s in self.owner.items() if s == server]
        return msgs if self.links else [*msgs, ("stop",)]

    def send(self, items: list[CompletionDelta | _Rejected], stats: EngineStats) -> None:
        """Each item to its request's server; every server gets the stats (its /metrics reads them)."""
        by_server: dict[int, list[CompletionDelta | _Rejected]] = {server: [] for server in self.links}
        for item in items:
            rid = item.request_id
            server = self.owner.pop(rid, None) if item.finished else self.owner.get(rid)
            if server in by_server:
                by_server[server].append(item)
        for server, mine in by_server.items():
            self._send(server, ("out", pack_outputs(mine), stats))

    def announce(self, msg: tuple[Any, ...]) -> None:
        for server in self.links:
            self._send(server, msg)

    def _send(self, server: int, msg: tuple[Any, ...]) -> None:
        try:
            self.links[server][1].send(msg)
        except OSError:
            pass  # that server is gone: its commands pipe says so at the next receive


# ---------------------------------------------------------------------- the engine process
def _engine_main(args: EngineArgs, links: ServerLinks) -> None:
    from osserve.engine.load import build_engine

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: its servers stop it
    # A SIGTERM (systemd's stop reaches every process of the unit) ends it as a return would: its
    # finalizers run (the grammar processes' shared memory is unlinked, not left to the resource
    # tracker, which warns of a leak).
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        engine = build_engine(args)
    except Exception as e:  # say why, instead of a silent dead child
        links.announce(("dead", repr(e)))
        return
    # Everything built so far (modules, the model, the KV manager's block records: ~400k objects)
    # lives as long as this process. Frozen, the collector's full passes skip it: unfrozen, each
    # took ~200 ms (one per ~200 steps at batch 229), about 1 ms per step on average. Collect
    # first: garbage still waiting in a cycle would be frozen too, and never freed.
    gc.collect()
    gc.freeze()
    # What the loop allocates and keeps a while (requests' state, deltas on their way) made Python's
    # threshold of 700 collect ~170 times a second at 256 streams, with a full pass (up to 7 ms, every
    # live request's state) ~1.5 times a second: 1.5-3.5% of the loop's time (H100, 2026-11-27,
    # benchmarks/diag/gc_time). The collector's count (container objects allocated, net of those
    # freed) stayed under 20,000 there: no collection ran over rounds of 1,024 requests. Garbage in
    # cycles is still collected once that many objects are waiting.
    gc.set_threshold(GC_THRESHOLD)
    # A thread waiting for the GIL gets it when the holder blocks, or after the switch interval
    # (5 ms by default). The grammars' mask threads start while the step loop turns the step
    # before's tokens into deltas, in Python: at 5 ms they began only when the loop blocked for
    # them, after the deltas (CPU: a 2 ms stretch of Python, then 0.9-1.3 ms of waiting for the
    # masks; at 0.2 ms, 0.05). This process runs the loop, those threads and the pipe's reader.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    links.announce(("ready", {"max_model_len": engine.max_model_len,
                              "max_waiting": engine.scheduler_config.max_waiting}))
    profile_log = ProfileLog(log)
    try:
        while True:
            out: list[CompletionDelta | _Rejected] = []
            # What arrived; when idle, wait (briefly) for the next request.
            for msg in links.receive(0 if engine.has_unfinished() else 0.5):
                if msg[0] == "stop":
                    return
                if msg[0] == "abort":
                    if (d := engine.abort(msg[1])) is not None:
                        out.append(d)
                else:  # ("add", request_id, prompt_token_ids, params)
                    _, rid, prompt, params = msg
                    try:
                        engine.add_request(rid, prompt, params)  # validates first
                    except OsserveError as e:
                        out.append(_Rejected(rid, type(e).__name__, e.message, e.param))
            if engine.has_unfinished():
                out += engine.step()
                profile_log.after_step(engine.profile)
            if out:
                links.send(out, engine.stats())
    except Exception as e:
        log.exception("engine step loop failed")
        links.announce(("dead", repr(e)))
    finally:
        gc.unfreeze()  # for the exit's collection: objects still frozen then are reported as leaked


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(0)


EngineMain = Callable[["EngineArgs", ServerLinks], None]


@dataclass
class EngineProcess:
    """A started engine process and its servers' ends of the pipes, one pair per server."""

    process: BaseProcess
    links: list[Link]
    info: dict[str, Any]  # from its "ready": max_model_len, max_waiting

    def stop(self) -> None:
        if self.process.is_alive():
            try:
                self.links[0][0].send(("stop",))
            except OSError:
                pass
            self.process.join(timeout=10)
            if self.process.is_alive():
                self.process.terminate()


def start_engine_process(args: EngineArgs, servers: int = 1, engine_main: EngineMain = _engine_main) -> EngineProcess:
    """Spawn the engine (CUDA cannot be forked) with pipes for `servers` HTTP server processes, and
    wait until it is ready. engine_main: the child's loop (benchmarks/profile_http.py passes one
    without a model)."""
    ctx = mp.get_context("spawn")
    engine_ends: dict[int, Link] = {}
    server_ends: list[Link] = []
    for server in range(servers):
        commands_in, commands_out = ctx.Pipe(duplex=False)  # (reader, writer): down to the engine
        outputs_in, outputs_out = ctx.Pipe(duplex=False)  # up from the engine
        engine_ends[server] = (commands_in, outputs_out)
        server_ends.append((commands_out, outputs_in))
    process = ctx.Process(target=engine_main, args=(args, ServerLinks(engine_ends)), name="osserve-engine",
                          daemon=True)
    process.start()
    for commands_in, outputs_out in engine_ends.values():
        commands_in.close()
        outputs_out.close()
    try:
        # The engine says "ready" (or "dead") to every server: read each, so none finds it later.
        kind, info = [outputs.recv() for _, outputs in server_ends][0]
    except EOFError:  # it died before it could say anything
        process.join(timeout=10)
        kind, info = "dead", f"it exited with code {process.exitcode}"
    if kind != "ready":
        process.join(timeout=10)
        raise EngineDeadError(f"the engine process failed to start: {info}")
    return EngineProcess(process, server_ends, info)


# ---------------------------------------------------------------------- the server side
class ProcessEngine:
    """Implements osserve.engine.core.outputs.EngineClient over an engine in another process, through
    one server's pair of pipes."""

    def __init__(self, link: Link, info: dict[str, Any], max_waiting: int | None = None,
                 process: EngineProcess | None = None) -> None:
        """process: the engine process, when this server started it and stops it at shutdown
        (server/api_servers.py's server processes share one their supervisor owns)."""
        self._commands, self._outputs = link
        self._process = process
        self._max_model_len: int = info["max_model_len"]
        self.max_waiting = max_waiting or info["max_waiting"]
        self._tokenizer = load_tokenizer()
        self._send_lock = threading.Lock()
        self._queues: Queues = {}
        self._stats = EngineStats()
        self._dead: str | None = None
        self._reader = threading.Thread(target=self._read_loop, name="osserve-engine-reader", daemon=True)
        self._reader.start()

    @classmethod
    def start(cls, args: EngineArgs, max_waiting: int | None = None,
              engine_main: EngineMain = _engine_main) -> ProcessEngine:
        """An engine process of its own, for this one server."""
        process = start_engine_process(args, 1, engine_main)
        return cls(process.links[0], process.info, max_waiting, process)

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def is_ready(self) -> bool:
        return self._dead is None and (self._process is None or self._process.process.is_alive())

    @property
    def tokenizer(self):  # type: ignore[no-untyped-def]
        return self._tokenizer

    def _send(self, msg: tuple[Any, ...]) -> None:
        with self._send_lock:
            self._commands.send(msg)

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, request_id: str
    ) -> AsyncIterator[CompletionDelta]:
        if self._dead is not None:
            raise EngineDeadError(f"the engine stopped: {self._dead}")
        if self._stats.num_waiting >= self.max_waiting:
            raise OverloadedError("the server is overloaded: too many requests are waiting")
        if request_id in self._queues:
            raise errors.InvalidRequestError(f"request id {request_id!r} is already in use", "request_id")
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._queues[request_id] = (asyncio.get_running_loop(), queue)
        self._send(("add", request_id, prompt_token_ids, params))
        finished = False
        try:
            while not finished:
                item = await queue.get()
                if isinstance(item, _Rejected):
                    finished = True
                    raise getattr(errors, item.kind, errors.InvalidRequestError)(item.message, item.param)
                item = coalesce(item, queue)
                finished = item.finished
                yield item
        finally:
            if not finished:  # the caller went away (client disconnect): free the blocks now
                await self.abort(request_id)

    async def abort(self, request_id: str) -> None:
        if self._dead is None:
            self._send(("abort", request_id))

    def stats(self) -> EngineStats:
        return self._stats

    def shutdown(self) -> None:
        if self._process is not None:
            self._process.stop()
        else:  # the engine, shared, goes on: hanging up aborts this server's requests there
            self._commands.close()

    def _read_loop(self) -> None:
        try:
            while True:
                msg = self._outputs.recv()
                if msg[0] == "dead":
                    self._dead = msg[1]
                    break
                _, out, self._stats = msg
                deliver(self._queues, [unpack_output(item) for item in out])
        except (EOFError, OSError) as e:
            self._dead = self._dead or f"the engine process exited ({e!r})"
        # Fail every open request: the engine cannot finish them any more.
        reason = self._dead or "the engine process exited"
        deliver(self._queues, [error_delta(rid, reason) for rid in list(self._queues)])

