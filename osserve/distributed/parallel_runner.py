"""Rank 0's side of a model split over N ranks: it lives in the engine's process (as vLLM's driver
worker), beside the scheduler and the sampler, and is the engine's ModelRunner.

    engine.step ─► ParallelRunner.run(entries, prev_tokens, copies)
                     1. the step's inputs down every worker's pipe (messages.py)
                     2. the previous step's sampled ids, still on the device, broadcast from rank 0
                        (async scheduling: the workers' inputs read them as rank 0's do)
                     3. ModelRunner.run here: the same forward on rank 0's shard, the all-reduces
                        inside it meeting the workers' (NCCL, captured in the CUDA graphs)
                   ◄─ logits from rank 0 alone (the lm_head is replicated; the workers compute none)

With one rank none of this exists: build_engine makes a plain ModelRunner, so a one-GPU step does
no extra work, no copy and no collective, and replays the same CUDA graphs.

A rank that dies (workers.py sees it) makes every later step raise EngineDeadError; a step in
flight on rank 0 is freed by aborting the group (NCCL; gloo raises by itself). If rank 0 is still
stuck in a collective or on the GPU BACKSTOP_S later, its process exits (code 1) rather than hang:
the server's HTTP side then answers 503 until it stops.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.util import Finalize
from typing import TypeVar

import torch

from osserve.config import ModelConfig
from osserve.distributed.collectives import RankGroup, rendezvous_store
from osserve.distributed.layout import ParallelConfig, ShardLayout
from osserve.distributed.messages import WorkerSpec, pack_step
from osserve.distributed.workers import WorkerPool, rank_devices
from osserve.engine.core.kv_cache import BlockCopy
from osserve.engine.worker.runner import BatchEntry, ModelRunner, StepLogits
from osserve.errors import EngineDeadError
from osserve.model.gpt_oss import GptOssForCausalLM, KVCache

log = logging.getLogger("osserve")
T = TypeVar("T")

BACKSTOP_S = 30.0


class Ranks:
    """Rank 0's hold on the others: its layout, the group, the workers, and what a death does."""

    def __init__(self, layout: ShardLayout, group: RankGroup, pool: WorkerPool) -> None:
        self.layout, self.group, self.pool = layout, group, pool
        self._busy = 0  # rank 0 is inside a step or the start-up (it may be waiting on the others)
        self._noticed = False  # a failure was raised to the engine: nothing is stuck
        self.last_step: torch.cuda.Event | None = None  # recorded after each step's launch (GPU)
        self._closed = False
        pool.on_failure(self._failed)
        # At exit too (also of the engine's own process, which runs no atexit): the workers stopped,
        # rank 0's communicator freed (collectives.py: not left to the interpreter's teardown).
        self._finalizer = Finalize(self, self.shutdown, exitpriority=10)

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Around anything that waits on the other ranks: an error there, once a rank is known to
        have died, is EngineDeadError."""
        self._busy += 1
        try:
            yield
        except EngineDeadError:
            self._noticed = True
            raise
        except Exception as e:
            if self.pool.wait_for_failure(2.0):
                self._noticed = True
                raise EngineDeadError(f"a tensor-parallel rank failed: {self.pool.failure}") from e
            raise
        finally:
            self._busy -= 1

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = self._noticed = True
        self.pool.shutdown()
        self.group.shutdown()
        self._finalizer.cancel()

    def _failed(self, reason: str) -> None:  # the watching thread
        self.group.abort()
        threading.Thread(target=self._backstop, name="osserve-rank-backstop", daemon=True).start()

    def _stuck(self) -> bool:
        last = self.last_step
        return self._busy > 0 or (last is not None and not last.query())

    def _backstop(self) -> None:
        time.sleep(BACKSTOP_S)
        if not self._noticed and self._stuck():
            log.critical("a tensor-parallel rank died (%s) and rank 0 is still waiting for it after %.0f s: "
                         "exiting", self.pool.failure, BACKSTOP_S)
            os._exit(1)


def start_ranks(args: object, cfg: ModelConfig, parallel: ParallelConfig, device: torch.device) -> Ranks:
    """Check that the model splits N ways and N devices are there (ConfigError), open the
    rendezvous (ConfigError on a busy --nccl-port), start ranks 1..N-1 and join the group as rank 0.
    args: the EngineArgs the workers build from (engine/load.py), its model a resolved folder."""
    layout = ShardLayout.of(cfg, 0, parallel.size, parallel.expert_parallel)
    devices = rank_devices(device, parallel)
    if device.type == "cpu":  # N processes share the host's cores: a torch thread pool each (worker.py)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // parallel.size))
    elif devices[0].index is not None:  # kernels launch on the current device: rank 0's
        torch.cuda.set_device(devices[0])
    backend = parallel.backend or ("nccl" if device.type == "cuda" else "gloo")
    store = rendezvous_store(parallel.port, parallel.size)
    pool = WorkerPool([WorkerSpec(args, r, parallel.size, store.port, backend, str(devices[r]))
                       for r in range(1, parallel.size)])
    try:
        # gloo's constructor waits for every rank to connect: a worker that dies first must not
        # leave this process waiting for it.
        group = watching(pool, lambda: RankGroup(store, 0, parallel.size, devices[0], backend))
    except BaseException:
        pool.shutdown()
        raise
    log.info("tensor parallelism: %d ranks (%s, %s), worker pids %s; attention by heads, experts %s",
             parallel.size, backend, ", ".join(map(str, devices)), list(pool.pids.values()),
             "by expert" if parallel.expert_parallel else f"by columns ({layout.intermediate} a rank)")
    return Ranks(layout, group, pool)


def watching(pool: WorkerPool, fn: Callable[[], T]) -> T:
    """fn() in a thread, raising EngineDeadError as soon as a worker fails instead of waiting on."""
    box: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=run, name="osserve-rank-join", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.1)
        pool.raise_if_failed()
    if errors:
        raise errors[0]
    return box[0]


class ParallelRunner(ModelRunner):
    """Rank 0's runner (module docstring): each step to every rank, then its own forward."""

    def __init__(self, model: GptOssForCausalLM, kv_caches: list[KVCache], block_size: int,
                 device: torch.device, ranks: Ranks) -> None:
        super().__init__(model, kv_caches, block_size, device)
        self.ranks = ranks

    @torch.inference_mode()
    def run(self, entries: list[BatchEntry], prev_tokens: torch.Tensor | None = None,
            copies: list[BlockCopy] | None = None, speculative: bool = False,
            capture: tuple[int, ...] = ()) -> StepLogits:
        if speculative:  # build_engine refuses speculative decoding with several ranks
            raise NotImplementedError("speculative steps over several ranks")
        ranks = self.ranks
        with ranks.busy():
            prev_len = -1 if prev_tokens is None else int(prev_tokens.shape[0])
            ranks.pool.send(pack_step(entries, copies, prev_len))
            if prev_tokens is not None and prev_len > 0:
                ranks.group.broadcast(prev_tokens.contiguous())
            out = super().run(entries, prev_tokens, copies)
        if self.device.type == "cuda":
            ranks.last_step = torch.cuda.Event()
            ranks.last_step.record()
        return out

    def shutdown(self) -> None:
        """Stop the other ranks' processes (also done at exit)."""
        self.ranks.shutdown()
