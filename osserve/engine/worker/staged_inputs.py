"""A decode graph's small per-step inputs as rows of one device buffer, sent by one copy a step.

A decode step's inputs are a handful of short arrays: token ids, the rows of the last step's
sampled ids that hold the ids still on the device (async scheduling; -1 where the id is given),
positions, each layer group's KV slots (int64), the sequence lengths (int32) and the row of the
pinned host ring that the head writes the greedy ids to (one int32, engine/worker/cuda_graphs.py).
Copied one by one they were five host-to-device copies a step on the GPU's queue ahead of the
graph, a few microseconds each at batch 1. Here they are rows of one device byte buffer, which
the graph reads through typed views captured once, and each step fills one of two persistent
pinned host buffers and copies it in whole (a few KB even at batch 256).

Two host buffers because the copy is asynchronous: the step after may fill the other one while
this one is still being read. Before a buffer is filled again, the event recorded after its
last copy is waited for (in the engine that copy is long done: the engine has read the sampled
ids of the step that made it). A first version (4ecedd6, reverted in 6dc720a on 2026-11-24 after a
served run lost throughput for a reason not found; BENCHMARKS.md) pinned a fresh array every copy.
"""

from __future__ import annotations

import numpy as np
import torch

ROWS_BEFORE_SLOTS = 3  # int64 rows: ids, pending rows, positions, then a slot row per layer group
NO_SLOT = -1  # a KV slot that writes nothing
NO_PENDING = -1  # a pending row that says: the id is the one given


class StagedInputs:
    """The device buffer, its typed views, and the two host buffers that fill it."""

    def __init__(self, rows: int, groups: list[str], device: torch.device) -> None:
        self.rows, self.groups = rows, groups
        wide = ROWS_BEFORE_SLOTS + len(groups)
        self.int64_bytes = wide * rows * 8
        nbytes = self.int64_bytes + (rows + 1) * 4  # the int32s: lengths, then the host slot
        self.buffer = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        int64_rows = self.buffer[: self.int64_bytes].view(torch.int64).view(wide, rows)
        # The views the graph reads.
        self.input_ids, self.pending_rows, self.positions = int64_rows[0], int64_rows[1], int64_rows[2]
        self.slots = {g: int64_rows[ROWS_BEFORE_SLOTS + i] for i, g in enumerate(groups)}
        int32s = self.buffer[self.int64_bytes:].view(torch.int32)
        self.seq_lens, self.host_slot = int32s[:rows], int32s[rows:]
        self.pending_rows.fill_(NO_PENDING)
        for s in self.slots.values():  # no KV write until a step says where
            s.fill_(NO_SLOT)
        cuda = device.type == "cuda"
        self.host = [torch.zeros(nbytes, dtype=torch.uint8, pin_memory=cuda) for _ in range(2)]
        # Waiting on an event never recorded returns at once (the first two sends).
        self.copied = [torch.cuda.Event() if cuda else None for _ in range(2)]
        self.turn = 0

    def send(self, b: int, ids: list[int], positions: np.ndarray, seq_lens: list[int],
             slots: dict[str, np.ndarray], pending_rows: np.ndarray | None = None, host_slot: int = 0) -> None:
        """The first b rows of every field (real rows, then padding: id 0, pending row -1, position
        0, length 0, slot -1; pending_rows None: -1 for all), copied to the device without waiting
        for it. The whole buffer is copied: rows past b hold what this host buffer last had, which
        a graph of b rows never reads."""
        t = self.turn
        event = self.copied[t]
        if event is not None:
            event.synchronize()
        data = self.host[t].numpy()
        int64_rows = data[: self.int64_bytes].view(np.int64).reshape(-1, self.rows)
        n = len(ids)
        _put(int64_rows[0], ids, n, b, 0)
        _put(int64_rows[1], NO_PENDING if pending_rows is None else pending_rows, n, b, NO_PENDING)
        _put(int64_rows[2], positions, n, b, 0)
        for i, g in enumerate(self.groups):
            _put(int64_rows[ROWS_BEFORE_SLOTS + i], slots[g], n, b, NO_SLOT)
        int32s = data[self.int64_bytes:].view(np.int32)
        _put(int32s, seq_lens, n, b, 0)
        int32s[self.rows] = host_slot
        self.buffer.copy_(self.host[t], non_blocking=True)
        if event is not None:
            event.record()
        self.turn = 1 - t


def _put(row: np.ndarray, values: np.ndarray | list[int] | int, n: int, b: int, pad: int) -> None:
    row[:n] = values
    row[n:b] = pad
