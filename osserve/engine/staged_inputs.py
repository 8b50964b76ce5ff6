"""A CUDA graph's per-step inputs as fields of one device buffer, written by one copy a step.

A decode step's inputs are a handful of small arrays: token ids, positions, sequence lengths, each
layer group's KV slots, and the rows that async scheduling fills on the device. Copied one by one
they were seven or eight host-to-device copies a step, each a transfer the GPU runs in turn between
the previous step's last kernel and the graph. Here each is a field of one byte buffer: the host
fills a fresh array of the same layout (`StagedHost`) and copies it in once; the graph reads typed
views of the device buffer (`StagedInputs.views`), captured once.

The host array is fresh each step and copied from pinned memory without waiting (cuda_graphs.
copy_in), so a step in flight never sees the next step's values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

ALIGN = 8  # bytes: every field starts where an int64 view may


@dataclass(frozen=True)
class Field:
    offset: int  # bytes into the buffer
    dtype: np.dtype
    size: int  # entries

    @property
    def end(self) -> int:
        return self.offset + self.size * self.dtype.itemsize


class StagedHost:
    """One step's host copy of the buffer: fields written with `put`, then StagedInputs.copy_in."""

    def __init__(self, layout: dict[str, Field], nbytes: int) -> None:
        self.layout = layout
        self.data = np.zeros(nbytes, dtype=np.uint8)

    def put(self, name: str, values: np.ndarray | list[int], pad: int) -> None:
        """The field's first len(values) entries, then `pad` to its end."""
        f = self.layout[name]
        view = self.data[f.offset: f.end].view(f.dtype)
        vals = np.asarray(values, dtype=f.dtype)
        view[: len(vals)] = vals
        view[len(vals):] = pad


class StagedInputs:
    def __init__(self, fields: dict[str, tuple[type, int]], device: torch.device) -> None:
        """fields: name -> (numpy dtype, entries), laid out in order, each 8-byte aligned."""
        self.layout: dict[str, Field] = {}
        offset = 0
        for name, (dtype, size) in fields.items():
            f = Field(offset, np.dtype(dtype), size)
            self.layout[name] = f
            offset = -(-f.end // ALIGN) * ALIGN
        self.nbytes = offset
        self.buffer = torch.zeros(offset, dtype=torch.uint8, device=device)
        self.views = {name: self.buffer[f.offset: f.end].view(torch.from_numpy(np.empty(0, f.dtype)).dtype)
                      for name, f in self.layout.items()}

    def host(self) -> StagedHost:
        return StagedHost(self.layout, self.nbytes)

    def send(self, host: StagedHost, input_ids: torch.Tensor | None = None, pending: Pending | None = None) -> None:
        """Copy the whole buffer in from `host` (one copy, without waiting for the device). With
        `pending`, its rows go in the "pending_rows" and "pending_prev" fields (the layout must
        have them), and after the copy prev_tokens[prev_rows] is written into input_ids[rows] on
        the device."""
        if pending is not None:
            host.put("pending_rows", pending.rows, 0)
            host.put("pending_prev", pending.prev_rows, 0)
        copy_in(self.buffer, host.data)
        if pending is not None:
            assert input_ids is not None
            p = len(pending.rows)
            rows, prev = self.views["pending_rows"][:p], self.views["pending_prev"][:p]
            input_ids.index_copy_(0, rows, pending.prev_tokens[prev].to(input_ids.dtype))


@dataclass(frozen=True)
class Pending:
    """Async scheduling's tokens still on the device: input row rows[i] takes prev_tokens[prev_rows[i]]."""

    rows: np.ndarray  # int64 rows of the step's flat input ids
    prev_rows: np.ndarray  # int64 rows of prev_tokens
    prev_tokens: torch.Tensor  # the previous step's sampled ids, on the device


class BlockTableInput:
    """A graph's block-table input [rows, max blocks] int32, -1 where no block. Each step copies
    its rows at their own width; columns past it are reset to -1 only where an earlier, wider step
    wrote them (a fill launch every step otherwise: at batch 1 decode the width only grows)."""

    def __init__(self, rows: int, width: int, device: torch.device) -> None:
        self.tensor = torch.full((rows, width), -1, dtype=torch.int32, device=device)
        self.written = np.zeros(rows, dtype=np.int64)  # columns of each row that may hold old entries

    def write(self, rows: np.ndarray) -> None:
        """rows [n, width] (cuda_graphs.block_table_array) into the first n rows."""
        n, width = rows.shape
        copy_in(self.tensor[:, :width], rows)
        stale = int(self.written[:n].max(initial=0))
        if stale > width:
            self.tensor[:n, width:stale].fill_(-1)
        self.written[:n] = width


def copy_in(dst: torch.Tensor, values: np.ndarray) -> None:
    """dst[:len(values)] = values without waiting for the device. Pinned on a GPU: a copy from
    pageable memory would make the host wait for the GPU's queue. CPU buffers (the host-only
    profile) take the array as it is."""
    host = torch.from_numpy(values)
    dst[: len(values)].copy_(host.pin_memory() if dst.is_cuda else host, non_blocking=True)
