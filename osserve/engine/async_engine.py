"""AsyncEngine: the engine for the server. The step loop runs in its own thread, so the event
loop is never blocked by the model; requests and aborts go in through a lock-protected inbox,
deltas come back to each request's asyncio.Queue via call_soon_threadsafe."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from osserve.engine.core.outputs import (
    CompletionDelta,
    EngineClient,
    EngineStats,
    Queues,
    coalesce,
    deliver,
    error_delta,
)
from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.engine import LLMEngine
from osserve.engine.step_profile import ProfileLog
from osserve.errors import EngineDeadError, OsserveError, OverloadedError

log = logging.getLogger("osserve")


@dataclass
class _Inbox:
    lock: threading.Lock = field(default_factory=threading.Lock)
    wake: threading.Event = field(default_factory=threading.Event)
    aborts: list[str] = field(default_factory=list)
    adds: list[tuple[str, list[int], SamplingParams]] = field(default_factory=list)


class AsyncEngine:
    """Implements osserve.engine.core.outputs.EngineClient over an LLMEngine."""

    def __init__(self, engine: LLMEngine, max_waiting: int | None = None) -> None:
        self.engine = engine
        self.max_waiting = max_waiting or engine.scheduler_config.max_waiting
        self._inbox = _Inbox()
        self._queues: Queues = {}
        self._stop = threading.Event()
        self._dead: str | None = None
        self._profile_log = ProfileLog(log)
        self._thread = threading.Thread(target=self._loop, name="osserve-engine", daemon=True)
        self._thread.start()

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def is_ready(self) -> bool:
        return self._dead is None and self._thread.is_alive()

    @property
    def tokenizer(self):  # type: ignore[no-untyped-def]
        return self.engine.tokenizer

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, request_id: str
    ) -> AsyncIterator[CompletionDelta]:
        if self._dead is not None:
            raise EngineDeadError(f"the engine stopped: {self._dead}")
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[CompletionDelta] = asyncio.Queue()
        # Validation reads only configuration, so it runs here and errors reach the caller before
        # anything is queued; the engine thread does the insertion without blocking this loop.
        self.engine.validate_request(request_id, prompt_token_ids, params)
        with self._inbox.lock:
            if self.engine.scheduler.num_waiting() + len(self._inbox.adds) >= self.max_waiting:
                raise OverloadedError("the server is overloaded: too many requests are waiting")
            self._inbox.adds.append((request_id, prompt_token_ids, params))
            self._queues[request_id] = (loop, queue)
        self._inbox.wake.set()
        finished = False
        try:
            while not finished:
                delta = coalesce(await queue.get(), queue)
                finished = delta.finished
                yield delta
        finally:
            if not finished:  # the caller went away (client disconnect): free the blocks now
                await self.abort(request_id)

    async def abort(self, request_id: str) -> None:
        with self._inbox.lock:
            self._inbox.aborts.append(request_id)
        self._inbox.wake.set()

    def stats(self) -> EngineStats:
        # Read without the lock: counters are ints, a snapshot a step old is fine for metrics.
        return self.engine.stats()

    def shutdown(self) -> None:
        self._stop.set()
        self._inbox.wake.set()
        self._thread.join(timeout=10)

    # ------------------------------------------------------------------ the engine thread
    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                with self._inbox.lock:
                    aborts, self._inbox.aborts = self._inbox.aborts, []
                    adds, self._inbox.adds = self._inbox.adds, []
                    if not adds and not aborts and not self.engine.has_unfinished():
                        self._inbox.wake.clear()
                deltas = []
                for rid, prompt, params in adds:
                    try:
                        self.engine.add_request(rid, prompt, params)
                    except OsserveError as e:  # validated already; a race on ids at most
                        deltas.append(error_delta(rid, str(e)))
                deltas += [d for rid in aborts if (d := self.engine.abort(rid)) is not None]
                busy = self.engine.has_unfinished()
                if busy:
                    deltas += self.engine.step()
                    self._profile_log.after_step(self.engine.profile)
                deliver(self._queues, deltas)
                if not busy:
                    self._inbox.wake.wait(timeout=0.5)
        except Exception as e:  # the loop must never die silently: fail every open request
            log.exception("engine step loop failed")
            self._dead = repr(e)
            failed = [error_delta(rid, self._dead) for rid in list(self._queues)]
            deliver(self._queues, failed)


def engine_in_own_process(args) -> bool:  # type: ignore[no-untyped-def]
    """--engine-process, by default on a GPU: there the host is the bottleneck, so the engine gets
    a GIL of its own."""
    from osserve.engine.load import resolve_device

    chosen: bool | None = getattr(args, "engine_process", None)
    return resolve_device(args.device).type == "cuda" if chosen is None else chosen


def build_async_engine(args) -> EngineClient:  # type: ignore[no-untyped-def]
    """For `osserve serve`: the engine from the CLI flags, its step loop in a thread or (with
    --engine-process, the default on a GPU) in a process of its own (engine/process_engine.py)."""
    from osserve.engine.load import EngineArgs, build_engine

    engine_args = EngineArgs.from_namespace(args)
    if engine_in_own_process(args):
        from osserve.engine.process_engine import ProcessEngine

        return ProcessEngine.start(engine_args, max_waiting=getattr(args, "max_waiting", None))
    return AsyncEngine(build_engine(engine_args), max_waiting=getattr(args, "max_waiting", None))
