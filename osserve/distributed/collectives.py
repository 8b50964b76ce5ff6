"""The ranks' process group: the rendezvous on 127.0.0.1, and the collectives the model and the
runner use. NCCL on GPUs (its all-reduces are captured into the decode steps' CUDA graphs like any
kernel), gloo on the CPU.

The group is a backend object of its own, not torch.distributed's default group: no process-wide
state, so one process can build, close and build again an engine of another size (the tests do).
All ranks must issue the same collectives in the same order: the runner's paths (graph, mixed
graph, eager) depend only on the step's entries, which every rank is sent.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from osserve.errors import ConfigError

log = logging.getLogger("osserve")

HOST = "127.0.0.1"
# Loading a 120b shard (or compiling kernels) on one rank while the others wait in the first
# collective must not time out; a rank that dies is seen at once by the engine (workers.py).
TIMEOUT = timedelta(minutes=30)
# How long rank 0 waits for its NCCL communicator's abort. After CUDA graphs have captured the
# group's collectives the abort does not return (2 x H200, 2026-11-26: still waiting 4 minutes on,
# torch's own wait being TIMEOUT; also where every rank aborted at once); past this the
# communicator is left to the process's exit.
ABORT_WAIT_S = 10.0


def rendezvous_store(port: int | None, size: int) -> dist.TCPStore:
    """Rank 0's store, listening on `port` (None: a free port the system picks; `.port` says which)."""
    try:
        return dist.TCPStore(HOST, port or 0, size, True, TIMEOUT, wait_for_workers=False)
    except RuntimeError as e:  # torch's DistNetworkError: EADDRINUSE and its like
        raise ConfigError(f"--nccl-port {port}: cannot listen on {HOST}:{port} for the ranks' rendezvous "
                          f"({e}); choose a free port or leave the flag out", "nccl_port") from e


def join_store(port: int, size: int) -> dist.TCPStore:
    """A worker's connection to rank 0's store."""
    return dist.TCPStore(HOST, port, size, False, TIMEOUT)


class RankGroup:
    """One rank's end of the group: all-reduce (sum, in place), broadcast from rank 0, min."""

    def __init__(self, store: dist.Store, rank: int, size: int, device: torch.device, backend: str) -> None:
        self.rank, self.size, self.device, self.backend = rank, size, device, backend
        if backend == "nccl":
            nccl = dist.ProcessGroupNCCL  # type: ignore[attr-defined]  # absent from CPU builds of torch
            options = nccl.Options()
            options.is_high_priority_stream = False
            options._timeout = TIMEOUT
            self._pg: Any = nccl(store, rank, size, options)
        elif backend == "gloo":
            options = getattr(dist.ProcessGroupGloo, "_Options")()  # noqa: B009  # private in torch's stubs
            options._devices = [dist.ProcessGroupGloo.create_device(hostname=HOST)]
            options._timeout = TIMEOUT
            self._pg = dist.ProcessGroupGloo(store, rank, size, options)
        else:
            raise ConfigError(f"unknown distributed backend {backend!r} (nccl or gloo)")
        self._pg._set_sequence_number_for_group()  # as torch.distributed's own groups (every rank calls it)
        self._sum = dist.AllreduceOptions()
        self._sum.reduceOp = dist.ReduceOp.SUM  # type: ignore[assignment]
        self._min = dist.AllreduceOptions()
        self._min.reduceOp = dist.ReduceOp.MIN  # type: ignore[assignment]
        self._from_rank0 = dist.BroadcastOptions()
        self._from_rank0.rootRank = 0
        # gloo on a GPU (tests of the sharded shapes on one GPU): through the host, where gloo takes
        # every dtype (its CUDA paths do not all take bf16).
        self._through_host = backend == "gloo" and device.type == "cuda"

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """x summed over the ranks, in place (x must be contiguous); returns x."""
        self._run(self._pg.allreduce, x, self._sum)
        return x

    def broadcast(self, x: torch.Tensor) -> None:
        """Rank 0's x into every rank's x, in place."""
        self._run(self._pg.broadcast, x, self._from_rank0)

    def min_over_ranks(self, values: list[int]) -> list[int]:
        """Element-wise minimum of every rank's `values` (each rank gives the same count)."""
        t = torch.tensor(values, dtype=torch.int64, device=self.device)
        self._run(self._pg.allreduce, t, self._min)
        return [int(v) for v in t.tolist()]

    def _run(self, collective: Any, x: torch.Tensor, options: Any) -> None:
        if self._through_host:
            staged = x.cpu()
            collective([staged], options).wait()
            x.copy_(staged)
            return
        collective([x], options).wait()

    def abort(self) -> None:
        """Break off every NCCL collective in flight (a rank died): a rank blocked in one returns or
        raises instead of waiting for the dead rank forever. Best effort, and at most ABORT_WAIT_S.
        (gloo raises by itself when a peer's connection closes.)"""
        if self.backend == "nccl":
            bounded(self._pg.abort, ABORT_WAIT_S, "aborting the NCCL communicator")

    def shutdown(self) -> None:
        """Free the group. NCCL's communicator is aborted, not destroyed: destroying one whose
        collectives were captured in CUDA graphs can hang (pytorch/pytorch issue 115388), and
        nothing is in flight any more. Waited for at most ABORT_WAIT_S."""
        if self.backend == "nccl":
            self.abort()
        else:
            bounded(self._pg.shutdown, ABORT_WAIT_S, "shutting the gloo group down")


def bounded(call: Callable[[], object], wait_s: float, what: str) -> bool:
    """call() in a daemon thread, waited for at most wait_s: whether it returned. Its errors are
    logged, not raised (the group may be half gone already). torch releases the GIL inside a
    communicator's abort, so a call that never returns costs only its thread."""
    def run() -> None:
        try:
            call()
        except Exception as e:
            log.debug("%s: %r", what, e)

    thread = threading.Thread(target=run, name="osserve-group-teardown", daemon=True)
    thread.start()
    thread.join(wait_s)
    if thread.is_alive():
        log.info("%s did not return within %.0f s; left to the process's exit", what, wait_s)
        return False
    return True
