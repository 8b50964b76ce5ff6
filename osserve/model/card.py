"""What the served model is, in numbers: its parameter count, the bytes of its weights, its
shape, and an identity (digest, date). Ollama clients show these (`/api/show`, `/api/tags`,
`/api/ps`); they are counted from the config, never written in by hand."""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osserve.config import ModelConfig


@dataclass(frozen=True)
class ModelCard:
    parameter_count: int
    weight_bytes: int  # the checkpoint's tensors: what the weights take on disk and in memory
    context_length: int
    digest: str  # sha256 of config.json (+ the shard index): the same checkpoint, the same digest
    modified_at: float  # seconds since the epoch: config.json's time, or the start for random weights
    on_gpu: bool
    quantization: str  # of the experts: MXFP4, or BF16
    shape: dict[str, Any] = field(default_factory=dict)  # layers, heads, experts, ...

    @property
    def parameter_size(self) -> str:
        """Ollama's way: 20.9B, 116.8B, 103.6M."""
        n = self.parameter_count
        return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def parameter_count(cfg: ModelConfig) -> int:
    """Every weight of the checkpoint's layout, MXFP4 experts as 2 values a byte of `_blocks`
    (their `_scales` are one per 32 values, not parameters): gpt-oss-20b has 20.9 B."""
    from osserve.model.weights import checkpoint_layout

    total = 0
    for name, (shape, _) in checkpoint_layout(cfg).items():
        if name.endswith("_scales"):
            continue
        total += math.prod(shape) * (2 if name.endswith("_blocks") else 1)
    return total


def weight_bytes(cfg: ModelConfig) -> int:
    from osserve.model.weights import checkpoint_layout

    return sum(math.prod(shape) * dtype.itemsize for shape, dtype in checkpoint_layout(cfg).values())


def model_card(cfg: ModelConfig, folder: Path | None, on_gpu: bool) -> ModelCard:
    """The card of a checkpoint folder, or (folder None) of random weights of `cfg`'s shapes."""
    if folder is not None:
        config_file = folder / "config.json"
        identity = config_file.read_bytes()
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            identity += index.read_bytes()
        modified = config_file.stat().st_mtime
    else:
        identity, modified = json.dumps(cfg.to_hf_dict(), sort_keys=True).encode(), time.time()
    shape = {"block_count": cfg.num_hidden_layers, "embedding_length": cfg.hidden_size,
             "feed_forward_length": cfg.intermediate_size, "expert_count": cfg.num_local_experts,
             "expert_used_count": cfg.num_experts_per_tok, "attention.head_count": cfg.num_attention_heads,
             "attention.head_count_kv": cfg.num_key_value_heads, "attention.key_length": cfg.head_dim,
             "attention.value_length": cfg.head_dim, "attention.sliding_window": cfg.sliding_window,
             "vocab_size": cfg.vocab_size, "rope.freq_base": cfg.rope.theta,
             "rope.scaling.factor": cfg.rope.factor,
             "rope.scaling.original_context_length": cfg.rope.original_max_position_embeddings}
    return ModelCard(parameter_count=parameter_count(cfg), weight_bytes=weight_bytes(cfg),
                     context_length=cfg.max_position_embeddings, digest=hashlib.sha256(identity).hexdigest(),
                     modified_at=modified, on_gpu=on_gpu,
                     quantization="MXFP4" if cfg.quant_method == "mxfp4" else "BF16", shape=shape)
