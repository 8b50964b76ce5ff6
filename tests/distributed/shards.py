"""One rank's share of a layer's experts, cut by the checkpoint's sharding rules (the loader's)."""

from __future__ import annotations

from osserve.config import ModelConfig
from osserve.distributed.layout import ShardLayout
from osserve.distributed.sharding import cut_tensor, rule_for
from osserve.ops.moe.weights import ExpertWeights

NAMES = {"gate_up_blocks": "gate_up_proj_blocks", "gate_up_scales": "gate_up_proj_scales",
         "gate_up_bias": "gate_up_proj_bias", "down_blocks": "down_proj_blocks", "down_scales": "down_proj_scales",
         "down_bias": "down_proj_bias"}


def expert_shard(experts: ExpertWeights, cfg: ModelConfig, layout: ShardLayout) -> ExpertWeights:
    def cut(field: str) -> object:
        return cut_tensor(getattr(experts, field), rule_for(f"model.layers.0.mlp.experts.{NAMES[field]}", cfg, layout))

    return ExpertWeights(**{field: cut(field) for field in NAMES})  # type: ignore[arg-type]
