"""A contiguous KV cache for model-level tests: sequence b owns blocks [b*n, (b+1)*n)."""

from __future__ import annotations

import torch

from osserve.model.gpt_oss import FULL_GROUP, SLIDING_GROUP, GptOssForCausalLM, KVCache
from osserve.ops.attention.metadata import AttentionMetadata, BlockTables


class ContiguousCache:
    def __init__(self, model: GptOssForCausalLM, num_seqs: int, max_len: int, block_size: int = 16,
                 kv_dtype: torch.dtype | None = None) -> None:
        """kv_dtype: the cache's (default the model's; torch.float8_e4m3fn: FP8 with scales)."""
        cfg = model.config
        self.block_size = block_size
        self.blocks_per_seq = -(-max_len // block_size)
        nb = num_seqs * self.blocks_per_seq
        param = next(model.parameters())
        self.device = param.device  # everything lives where the model does
        dtype = kv_dtype or param.dtype
        self.kv: list[KVCache] = [KVCache.allocate(nb, block_size, cfg.num_key_value_heads, cfg.head_dim, dtype,
                                                   self.device) for _ in range(cfg.num_hidden_layers)]
        self.lens = [0] * num_seqs

    def step(self, seq_ids: list[int], chunks: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """Input ids, positions and metadata for appending `chunks[i]` to sequence seq_ids[i]."""
        ids, pos, slots, qlens, slens = [], [], [], [], []
        for s, chunk in zip(seq_ids, chunks, strict=True):
            start = self.lens[s]
            for j, t in enumerate(chunk):
                p = start + j
                ids.append(t)
                pos.append(p)
                slots.append(s * self.blocks_per_seq * self.block_size + p)
            self.lens[s] += len(chunk)
            qlens.append(len(chunk))
            slens.append(self.lens[s])
        tables = torch.tensor(
            [[s * self.blocks_per_seq + k for k in range(self.blocks_per_seq)] for s in seq_ids],
            dtype=torch.int32,
        )
        dev = self.device
        bt = BlockTables(tables.to(dev), torch.tensor(slots, dtype=torch.int64, device=dev))
        qsl = torch.tensor([0] + list(torch.tensor(qlens).cumsum(0).tolist()), dtype=torch.int32, device=dev)
        meta = AttentionMetadata(
            query_start_loc=qsl,
            seq_lens=torch.tensor(slens, dtype=torch.int32, device=dev),
            query_lens_host=qlens,
            seq_lens_host=slens,
            groups={SLIDING_GROUP: bt, FULL_GROUP: bt},
        )
        return torch.tensor(ids, device=dev), torch.tensor(pos, device=dev), meta
