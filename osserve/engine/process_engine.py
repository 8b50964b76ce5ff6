"""ProcessEngine: the engine's step loop in its own process, for the server under load.

With the step loop in a thread (AsyncEngine), the engine and the HTTP server share one GIL: at
256 streams, each step's host work (scheduling, batch building, detokenising) is stretched by the
server's per-token work (harmony parsing, JSON, SSE writes) and the GPU waits. Here the engine
runs in a child process (spawned: CUDA cannot be forked) and talks to the server through two
pipes: requests and aborts go down, each step's deltas (with an EngineStats snapshot) come up. A
reader thread in the server process hands the deltas to each request's asyncio.Queue.

A request the engine rejects (bad input, too long) comes back as a `rejected` message, raised as
the same typed osserve error from the first `anext` of `generate`, before any delta is yielded.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import multiprocessing as mp
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from osserve import errors
from osserve.engine.load import EngineArgs
from osserve.engine.outputs import CompletionDelta, EngineStats, Queues, coalesce, deliver, error_delta
from osserve.engine.sampling_params import SamplingParams
from osserve.errors import EngineDeadError, OsserveError, OverloadedError
from osserve.tokenizer import load_tokenizer

log = logging.getLogger("osserve")


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


# ---------------------------------------------------------------------- the engine process
def _engine_main(args: EngineArgs, commands: Connection, outputs: Connection) -> None:
    from osserve.engine.load import build_engine

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        engine = build_engine(args)
    except Exception as e:  # say why, instead of a silent dead child
        outputs.send(("dead", repr(e)))
        return
    # Everything built so far (modules, the model, the KV manager's block records: ~400k objects)
    # lives as long as this process. Frozen, the collector's full passes skip it: unfrozen, each
    # took ~200 ms (one per ~200 steps at batch 229), about 1 ms per step on average. Collect
    # first: garbage still waiting in a cycle would be frozen too, and never freed.
    gc.collect()
    gc.freeze()
    outputs.send(("ready", {"max_model_len": engine.max_model_len,
                            "max_waiting": engine.scheduler_config.max_waiting}))
    try:
        while True:
            busy = engine.has_unfinished()
            out: list[CompletionDelta | _Rejected] = []
            # Drain what arrived; when idle, block (briefly) for the next request.
            while commands.poll(0 if busy else 0.5):
                msg = commands.recv()
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
                busy = True
            if engine.has_unfinished():
                out += engine.step()
                profile = engine.profile
                if profile.steps and profile.steps % profile.every == 0:
                    log.info("engine: %s", profile.summary())
            if out:
                outputs.send(("out", pack_outputs(out), engine.stats()))
    except EOFError:
        return  # the server closed its end of the pipe without a "stop": it is gone, nothing to tell
    except Exception as e:
        log.exception("engine step loop failed")
        outputs.send(("dead", repr(e)))
    finally:
        gc.unfreeze()  # for the exit's collection: objects still frozen then are reported as leaked


# ---------------------------------------------------------------------- the server side
class ProcessEngine:
    """Implements osserve.engine.outputs.EngineClient over an engine in a child process."""

    def __init__(self, args: EngineArgs, max_waiting: int | None = None,
                 engine_main: Callable[[EngineArgs, Connection, Connection], None] = _engine_main) -> None:
        """engine_main: the child's loop (benchmarks/profile_http.py passes one without a model)."""
        ctx = mp.get_context("spawn")
        child_commands, self._commands = ctx.Pipe(duplex=False)  # (reader, writer): down to the engine
        self._outputs, child_outputs = ctx.Pipe(duplex=False)  # up from the engine
        self._proc = ctx.Process(target=engine_main, args=(args, child_commands, child_outputs),
                                 name="osserve-engine", daemon=True)
        self._proc.start()
        child_commands.close()
        child_outputs.close()
        kind, info = self._outputs.recv()
        if kind != "ready":
            self._proc.join(timeout=10)
            raise EngineDeadError(f"the engine process failed to start: {info}")
        self._max_model_len: int = info["max_model_len"]
        self.max_waiting = max_waiting or info["max_waiting"]
        self._tokenizer = load_tokenizer()
        self._send_lock = threading.Lock()
        self._queues: Queues = {}
        self._stats = EngineStats()
        self._dead: str | None = None
        self._reader = threading.Thread(target=self._read_loop, name="osserve-engine-reader", daemon=True)
        self._reader.start()

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    @property
    def is_ready(self) -> bool:
        return self._dead is None and self._proc.is_alive()

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
        if self._proc.is_alive():
            try:
                self._send(("stop",))
            except OSError:
                pass
            self._proc.join(timeout=10)
            if self._proc.is_alive():
                self._proc.terminate()

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

