"""ModelRunner: one scheduled batch -> tensors -> model.forward -> logits of the rows to sample.

It knows tensors and nothing of requests: the engine hands it `BatchEntry`s (token ids, first
position, block tables, whether to sample) built from the scheduler's plain-Python output.
All metadata is built once per step on the host and copied in one go, so no layer syncs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from osserve.engine.cuda_graphs import DecodeGraphs
from osserve.model.gpt_oss import GptOssForCausalLM, KVCache
from osserve.ops.attention import AttentionMetadata, BlockTables


@dataclass
class BatchEntry:
    """One sequence's part of a step: `token_ids` at positions start_pos, start_pos+1, ..."""

    token_ids: list[int]
    start_pos: int
    block_tables: dict[str, list[int]]  # by layer group; -1 where a block was freed
    sample: bool  # the last row's logits are wanted (this chunk reaches the sequence's end)


@dataclass
class ModelInput:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    meta: AttentionMetadata
    sample_rows: torch.Tensor  # [S] rows of the flat batch whose logits are wanted


class ModelRunner:
    def __init__(
        self, model: GptOssForCausalLM, kv_caches: list[KVCache], block_size: int,
        device: torch.device,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        self.pin = device.type == "cuda"
        self.graphs: DecodeGraphs | None = None

    def capture_decode_graphs(self, groups: list[str], max_model_len: int, max_batch: int) -> None:
        """Record decode steps as CUDA graphs (the runner, not the model, decides this)."""
        self.graphs = DecodeGraphs(self.model, self.kv_caches, groups, self.block_size, max_model_len, max_batch)
        self.graphs.capture()

    def _to_device(self, data: list[int], dtype: torch.dtype) -> torch.Tensor:
        t = torch.tensor(data, dtype=dtype, pin_memory=self.pin)
        return t.to(self.device, non_blocking=True)

    def prepare(self, entries: list[BatchEntry]) -> ModelInput:
        bs = self.block_size
        ids: list[int] = []
        pos: list[int] = []
        query_lens: list[int] = []
        seq_lens: list[int] = []
        sample_rows: list[int] = []
        groups = list(entries[0].block_tables) if entries else []
        slots: dict[str, list[int]] = {g: [] for g in groups}
        for e in entries:
            n = len(e.token_ids)
            positions = range(e.start_pos, e.start_pos + n)
            ids.extend(e.token_ids)
            pos.extend(positions)
            for g in groups:
                table = e.block_tables[g]
                slots[g].extend(table[p // bs] * bs + p % bs for p in positions)
            query_lens.append(n)
            seq_lens.append(e.start_pos + n)
            if e.sample:
                sample_rows.append(len(ids) - 1)
        tables: dict[str, BlockTables] = {}
        for g in groups:
            width = max(len(e.block_tables[g]) for e in entries)
            padded = [e.block_tables[g] + [-1] * (width - len(e.block_tables[g])) for e in entries]
            table_t = torch.tensor(padded, dtype=torch.int32, pin_memory=self.pin)
            tables[g] = BlockTables(
                block_tables=table_t.to(self.device, non_blocking=True),
                slot_mapping=self._to_device(slots[g], torch.int64),
            )
        starts = [0]
        for n in query_lens:
            starts.append(starts[-1] + n)
        meta = AttentionMetadata(
            query_start_loc=self._to_device(starts, torch.int32),
            seq_lens=self._to_device(seq_lens, torch.int32),
            query_lens_host=query_lens,
            seq_lens_host=seq_lens,
            groups=tables,
        )
        return ModelInput(
            input_ids=self._to_device(ids, torch.int64),
            positions=self._to_device(pos, torch.int64),
            meta=meta,
            sample_rows=self._to_device(sample_rows, torch.int64),
        )

    @torch.inference_mode()
    def run(self, entries: list[BatchEntry]) -> torch.Tensor:
        """Logits [S, vocab] (float32) for the entries with sample=True, in their order."""
        if self.graphs is not None and self.graphs.can_run(len(entries)) and all(
            len(e.token_ids) == 1 and e.sample for e in entries
        ):
            hidden = self.graphs.run(
                [e.token_ids[0] for e in entries], [e.start_pos for e in entries],
                [e.start_pos + 1 for e in entries],
                {g: [e.block_tables[g] for e in entries] for g in entries[0].block_tables},
            )
            return self.model.compute_logits(hidden)
        inp = self.prepare(entries)
        hidden = self.model(inp.input_ids, inp.positions, inp.meta, self.kv_caches)
        return self.model.compute_logits(hidden[inp.sample_rows])
