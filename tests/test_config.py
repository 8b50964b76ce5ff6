from __future__ import annotations

import json
from pathlib import Path

import pytest

from osserve.config import FULL, SLIDING, ModelConfig, preset
from osserve.errors import ConfigError

# The config.json of openai/gpt-oss-20b, as published.
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0,
    "eos_token_id": 200002, "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2880, "initial_context_length": 4096, "initializer_range": 0.02,
    "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "max_position_embeddings": 131072, "model_type": "gpt_oss", "num_attention_heads": 64,
    "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 8,
    "num_local_experts": 32, "output_router_logits": False, "pad_token_id": 199999,
    "quantization_config": {
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"],
        "quant_method": "mxfp4",
    },
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn",
                     "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
    "swiglu_limit": 7.0, "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0",
    "use_cache": True, "vocab_size": 201088,
}


def write(tmp_path: Path, raw: dict) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return tmp_path


def test_reads_the_real_20b_config(tmp_path: Path) -> None:
    cfg = ModelConfig.from_pretrained(write(tmp_path, GPT_OSS_20B))
    assert cfg == preset("20b")
    assert cfg.layer_types[:2] == (SLIDING, FULL) and cfg.window_of(0) == 128
    assert cfg.window_of(1) is None and cfg.rope.factor == 32.0 and cfg.quant_method == "mxfp4"


def test_roundtrip_through_hf_dict(tmp_path: Path) -> None:
    for name in ("tiny", "20b", "120b"):
        cfg = preset(name)
        assert ModelConfig.from_pretrained(write(tmp_path, cfg.to_hf_dict())) == cfg


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"model_type": "llama"}, "model_type"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),
        ({"quantization_config": {"quant_method": "gptq"}}, "quantization_config"),
        ({"layer_types": ["sliding_attention"] * 3}, "layer_types"),
        ({"layer_types": ["weird"] * 24}, "layer_types"),
        ({"tie_word_embeddings": True}, "tie_word_embeddings"),
        ({"num_key_value_heads": 7}, "num_key_value_heads"),
        ({"num_experts_per_tok": 64, "experts_per_token": 64}, "num_experts_per_tok"),
    ],
)
def test_rejects_unsupported_configs_naming_the_field(tmp_path: Path, change: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        ModelConfig.from_pretrained(write(tmp_path, GPT_OSS_20B | change))


def test_missing_field_and_folder(tmp_path: Path) -> None:
    raw = dict(GPT_OSS_20B)
    del raw["hidden_size"]
    with pytest.raises(ConfigError, match="hidden_size"):
        ModelConfig.from_pretrained(write(tmp_path, raw))
    with pytest.raises(ConfigError, match="no config.json"):
        ModelConfig.from_pretrained(tmp_path / "nowhere")
