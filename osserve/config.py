"""Configuration dataclasses: the model (read from a Hugging Face `config.json`) and the engine.

Each component receives only the fields it uses; these dataclasses are the one source of truth
for every number (layer count, window, block size, ...).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osserve.errors import ConfigError

SLIDING = "sliding_attention"
FULL = "full_attention"


@dataclass(frozen=True)
class YarnRope:
    """YaRN rotary embedding parameters (`rope_scaling` with `rope_type: yarn`)."""

    theta: float = 150000.0
    factor: float = 32.0
    original_max_position_embeddings: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = False


@dataclass(frozen=True)
class ModelConfig:
    """The architecture of a gpt-oss model, field names as in Hugging Face's `config.json`."""

    vocab_size: int = 201088
    hidden_size: int = 2880
    intermediate_size: int = 2880
    num_hidden_layers: int = 24
    num_attention_heads: int = 64
    num_key_value_heads: int = 8
    head_dim: int = 64
    num_local_experts: int = 32
    num_experts_per_tok: int = 4
    sliding_window: int = 128
    layer_types: tuple[str, ...] = ()
    rope: YarnRope = field(default_factory=YarnRope)
    rms_norm_eps: float = 1e-5
    swiglu_limit: float = 7.0
    max_position_embeddings: int = 131072
    eos_token_id: int = 200002
    pad_token_id: int = 199999
    quant_method: str | None = "mxfp4"  # experts stored as MXFP4 blocks/scales; None: bf16

    def __post_init__(self) -> None:
        if not self.layer_types:
            # gpt-oss alternates, starting with a sliding-window layer.
            types = tuple(SLIDING if i % 2 == 0 else FULL for i in range(self.num_hidden_layers))
            object.__setattr__(self, "layer_types", types)
        self.validate()

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def sliding_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == SLIDING]

    @property
    def full_layers(self) -> list[int]:
        return [i for i, t in enumerate(self.layer_types) if t == FULL]

    def window_of(self, layer: int) -> int | None:
        """The attention window of a layer in tokens (None: full attention)."""
        return self.sliding_window if self.layer_types[layer] == SLIDING else None

    def validate(self) -> None:
        def need(cond: bool, fld: str, why: str) -> None:
            if not cond:
                raise ConfigError(f"unsupported config.json: field '{fld}' {why}")

        need(len(self.layer_types) == self.num_hidden_layers, "layer_types",
             f"has {len(self.layer_types)} entries for {self.num_hidden_layers} layers")
        bad = {t for t in self.layer_types if t not in (SLIDING, FULL)}
        need(not bad, "layer_types", f"has unknown layer types {sorted(bad)}")
        need(self.num_attention_heads % self.num_key_value_heads == 0, "num_key_value_heads",
             "must divide num_attention_heads")
        need(0 < self.num_experts_per_tok <= self.num_local_experts, "num_experts_per_tok",
             "must be in 1..num_local_experts")
        need(self.sliding_window > 0, "sliding_window", "must be positive")
        need(self.quant_method in (None, "mxfp4"), "quantization_config",
             f"quant_method {self.quant_method!r} is not supported (only mxfp4 or none)")
        if self.quant_method == "mxfp4":
            need(self.hidden_size % 32 == 0, "hidden_size", "must be a multiple of 32 for MXFP4")
            need(self.intermediate_size % 32 == 0, "intermediate_size",
                 "must be a multiple of 32 for MXFP4")

    # ------------------------------------------------------------------ (de)serialisation
    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        def get(key: str, default: Any = None, required: bool = True) -> Any:
            if key in raw:
                return raw[key]
            if required and default is None:
                raise ConfigError(f"unsupported config.json: required field '{key}' is missing")
            return default

        model_type = raw.get("model_type")
        if model_type != "gpt_oss":
            raise ConfigError(
                f"unsupported config.json: field 'model_type' is {model_type!r}, expected 'gpt_oss'"
            )
        if raw.get("tie_word_embeddings", False):
            raise ConfigError("unsupported config.json: field 'tie_word_embeddings' must be false")
        if raw.get("attention_bias", True) is not True:
            raise ConfigError("unsupported config.json: field 'attention_bias' must be true")
        if raw.get("hidden_act", "silu") != "silu":
            raise ConfigError("unsupported config.json: field 'hidden_act' must be 'silu'")
        rs = raw.get("rope_scaling") or {}
        rope_type = rs.get("rope_type", rs.get("type"))
        if rope_type != "yarn":
            raise ConfigError(
                f"unsupported config.json: field 'rope_scaling' has rope_type {rope_type!r}, "
                "expected 'yarn'"
            )
        rope = YarnRope(
            theta=float(get("rope_theta", 150000.0, required=False)),
            factor=float(rs.get("factor", 32.0)),
            original_max_position_embeddings=int(
                rs.get("original_max_position_embeddings", raw.get("initial_context_length", 4096))
            ),
            beta_fast=float(rs.get("beta_fast", 32.0)),
            beta_slow=float(rs.get("beta_slow", 1.0)),
            truncate=bool(rs.get("truncate", False)),
        )
        qc = raw.get("quantization_config")
        quant = None if qc is None else qc.get("quant_method")
        experts_per_tok = raw.get("num_experts_per_tok", raw.get("experts_per_token"))
        eos = raw.get("eos_token_id", 200002)
        if isinstance(eos, list):
            eos = eos[0]
        return cls(
            vocab_size=int(get("vocab_size")),
            hidden_size=int(get("hidden_size")),
            intermediate_size=int(get("intermediate_size")),
            num_hidden_layers=int(get("num_hidden_layers")),
            num_attention_heads=int(get("num_attention_heads")),
            num_key_value_heads=int(get("num_key_value_heads")),
            head_dim=int(get("head_dim")),
            num_local_experts=int(get("num_local_experts")),
            num_experts_per_tok=int(experts_per_tok if experts_per_tok is not None else 4),
            sliding_window=int(get("sliding_window")),
            layer_types=tuple(raw.get("layer_types") or ()),
            rope=rope,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
            swiglu_limit=float(raw.get("swiglu_limit", 7.0)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 131072)),
            eos_token_id=int(eos),
            pad_token_id=int(raw.get("pad_token_id", 199999)),
            quant_method=quant,
        )

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> ModelConfig:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ConfigError(f"no config.json in {model_dir}: is this a gpt-oss checkpoint folder?")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path} is not valid JSON: {e}") from e
        return cls.from_dict(raw)

    def to_hf_dict(self) -> dict[str, Any]:
        """The `config.json` of this model, in the layout of openai/gpt-oss-20b."""
        out: dict[str, Any] = {
            "architectures": ["GptOssForCausalLM"],
            "attention_bias": True,
            "attention_dropout": 0.0,
            "eos_token_id": self.eos_token_id,
            "experts_per_token": self.num_experts_per_tok,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "initial_context_length": self.rope.original_max_position_embeddings,
            "initializer_range": 0.02,
            "intermediate_size": self.intermediate_size,
            "layer_types": list(self.layer_types),
            "max_position_embeddings": self.max_position_embeddings,
            "model_type": "gpt_oss",
            "num_attention_heads": self.num_attention_heads,
            "num_experts_per_tok": self.num_experts_per_tok,
            "num_hidden_layers": self.num_hidden_layers,
            "num_key_value_heads": self.num_key_value_heads,
            "num_local_experts": self.num_local_experts,
            "output_router_logits": False,
            "pad_token_id": self.pad_token_id,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_scaling": {
                "beta_fast": self.rope.beta_fast,
                "beta_slow": self.rope.beta_slow,
                "factor": self.rope.factor,
                "original_max_position_embeddings": self.rope.original_max_position_embeddings,
                "rope_type": "yarn",
                "truncate": self.rope.truncate,
            },
            "rope_theta": self.rope.theta,
            "router_aux_loss_coef": 0.9,
            "sliding_window": self.sliding_window,
            "swiglu_limit": self.swiglu_limit,
            "tie_word_embeddings": False,
            "use_cache": True,
            "vocab_size": self.vocab_size,
        }
        if self.quant_method == "mxfp4":
            out["quantization_config"] = {
                "modules_to_not_convert": [
                    "model.layers.*.self_attn",
                    "model.layers.*.mlp.router",
                    "model.embed_tokens",
                    "lm_head",
                ],
                "quant_method": "mxfp4",
            }
        return out


def preset(name: str) -> ModelConfig:
    """The model shapes osserve knows by name: `tiny` for tests, `20b` and `120b` the real ones."""
    if name == "20b":
        return ModelConfig(num_hidden_layers=24, num_local_experts=32)
    if name == "120b":
        return ModelConfig(num_hidden_layers=36, num_local_experts=128)
    if name == "tiny":
        # Real vocabulary and head ratios (64 q heads : 8 kv heads is 8:1; head_dim 64),
        # small enough that a CPU forward over 300 tokens takes well under a second.
        return ModelConfig(
            hidden_size=128,
            intermediate_size=128,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=1,
            head_dim=64,
            num_local_experts=8,
            num_experts_per_tok=4,
        )
    raise ConfigError(f"unknown preset {name!r}: choose tiny, 20b or 120b")


PRESETS = ("tiny", "20b", "120b")
# Decode-first's default min_decodes: three quarters of max_num_seqs, at most 3/256 of the step budget
# (192 decodes at 16,384 tokens a step, 96 at 8,192). While fewer decode, a burst of prompts is
# prefilled in full-budget steps, and each such step holds up every request already decoding: about
# M^2 x (prompt tokens) / (2 x budget) gaps are stalled before the chunk applies from M decodes. So M
# grows with the budget, not the running set. Measured (BENCHMARKS.md, "Capacity", and its history
# file of 2026-11-27, "decode-first"): the 20b on an H100 (16,384 a step) at c=256, 192 gave more
# output and a lower ITL p99 and TTFT p99 than 32, and 240 let the ITL p99 past 60 ms; the 120b on an
# H200 (8,192 a step) at c=512, 384 (three quarters) made ITL p99 255 ms against 110 from 32, for
# +0.6% output.
DECODE_FIRST_SHARE = 3 / 4
DECODE_FIRST_PER_BUDGET = 3 / 256


# SchedulerConfig's defaults for the running set and the step's tokens (decode-first's default reads both).
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_BATCHED_TOKENS = 8192


def default_min_decodes(max_num_seqs: int, step_budget: int) -> int:
    """Decode-first's min_decodes where none is given (the note above)."""
    return max(1, min(round(max_num_seqs * DECODE_FIRST_SHARE), int(step_budget * DECODE_FIRST_PER_BUDGET)))


@dataclass(frozen=True)
class CacheConfig:
    """The paged KV cache: block size and how much memory the pool may take."""

    block_size: int = 16
    num_blocks: int | None = None  # None: sized from the memory budget
    kv_cache_gb: float | None = None  # CPU budget; on GPU, gpu_memory_utilization decides
    gpu_memory_utilization: float = 0.90
    enable_prefix_caching: bool = True


@dataclass(frozen=True)
class SchedulerConfig:
    """What one engine step may hold."""

    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    # Tokens one step may compute. On a GPU whose KV cache hardly notices the larger workspace,
    # load.py defaults to more (engine/memory.py's default_batched_tokens).
    max_num_batched_tokens: int = DEFAULT_BATCHED_TOKENS
    max_model_len: int = 8192
    max_waiting: int = 4096  # beyond this the server answers 503
    # While requests are decoding, newcomers wait up to this long so that several are admitted
    # together: a step with any prefill runs eagerly, a decode-only step replays a CUDA graph, so
    # admitting one newcomer per step would make every step a slow eager one. 0: admit at once.
    admission_delay_s: float = 0.0
    admission_batch: int = 32  # ... or until this many newcomers wait
    # Schedule and launch step N+1 while step N runs on the device (its sampled tokens stay
    # there, the next step reads them in place); the host reads step N's tokens afterwards.
    async_scheduling: bool = True
    # ... steps with prompt tokens too (prompt chunks, newcomers with a prefill): launched beside the
    # step in flight where every request in them can run ahead and gets its KV slots without a
    # preemption. Off: such a step first finishes the one in flight (the GPU idles for the host).
    async_prefill: bool = True
    # Speculative decoding: KV slots a request may hold past its tokens (its drafts and the draft
    # model's guesses), counted when checking that a request can ever fit the cache.
    speculative_slots: int = 0
    # Decode-first (engine/core/decode_first.py): while at least decode_first_min_decodes requests
    # decode, a step takes at most decode_first_chunk prompt tokens, so their next tokens are not
    # held up behind a long prefill. 0: off (prompts may take the whole step, as before).
    decode_first_chunk: int = 2048
    # For the default max_num_seqs and budget; load.py takes default_min_decodes of the server's
    decode_first_min_decodes: int = default_min_decodes(DEFAULT_MAX_NUM_SEQS, DEFAULT_BATCHED_TOKENS)

    def __post_init__(self) -> None:
        if self.max_model_len < 3:  # the warm-up's prompts hold a token and leave room for two out
            raise ConfigError(f"--max-model-len must be at least 3 tokens, not {self.max_model_len}", "max_model_len")
        if self.max_num_batched_tokens < 1:
            raise ConfigError(f"--max-num-batched-tokens must be at least 1, not {self.max_num_batched_tokens}",
                              "max_num_batched_tokens")
        if self.decode_first_chunk < 0:
            raise ConfigError(f"--decode-first-chunk must be 0 (off) or a number of tokens, not "
                              f"{self.decode_first_chunk}", "decode_first_chunk")
        if self.decode_first_min_decodes < 1:
            raise ConfigError(f"--decode-first-min-decodes must be at least 1, not {self.decode_first_min_decodes}",
                              "decode_first_min_decodes")

