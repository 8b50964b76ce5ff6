"""What goes down the pipes from the engine to the worker processes.

Once, at start: a WorkerSpec (what to build). Then one message a step: the step's runner inputs,
the same BatchEntry list and block copies rank 0's runner gets, as plain tuples (pickling 256
dataclasses cost several times more), and the length of the previous step's sampled ids that
follow by a broadcast on the device (-1: none). b"stop" ends a worker.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass

from osserve.engine.core.kv_cache import BlockCopy
from osserve.engine.worker.runner import BatchEntry

STOP = b"stop"


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs to build its rank."""

    args: object  # the engine's EngineArgs (engine/load.py), its model resolved to a folder
    rank: int
    size: int
    port: int  # rank 0's rendezvous store on 127.0.0.1
    backend: str  # "nccl" or "gloo"
    device: str  # this rank's device, e.g. "cuda:3" or "cpu"


def pack_step(entries: list[BatchEntry], copies: list[BlockCopy] | None, prev_len: int) -> bytes:
    rows = [(e.token_ids, e.start_pos, e.block_tables, e.sample, e.prev_row) for e in entries]
    moves = [(c.group, c.src, c.dst) for c in copies or ()]
    return pickle.dumps((rows, moves, prev_len), protocol=pickle.HIGHEST_PROTOCOL)


def unpack_step(blob: bytes) -> tuple[list[BatchEntry], list[BlockCopy], int]:
    rows, moves, prev_len = pickle.loads(blob)
    return [BatchEntry(*row) for row in rows], [BlockCopy(*m) for m in moves], prev_len
