"""The EAGLE3 draft model: one Llama decoder layer that predicts the target's next tokens from its
own earlier guesses and three of the target's hidden states (Li et al., EAGLE-3, 2025).

    hidden   = fc(concat(h_a, h_b, h_c))              # the target's layers a, b, c; [T, 3H] -> [T, H]
    x        = concat(input_layernorm(embed(token)), hidden_norm(hidden))        # [T, 2H]
    residual = hidden + o_proj(attention(q/k/v_proj(x)))                         # q/k/v take 2H
    prenorm  = residual + mlp(post_attention_layernorm(residual))                # SiLU-gated, no biases
    logits   = lm_head(norm(prenorm))                 # over the draft vocabulary (d2t: draft -> target)

Row t holds the token at position p + 1 and the target's hidden states at position p, at RoPE
position p; its logits guess the token at p + 2. The next draft step feeds `prenorm` back in
place of fc's output (the target's states are not known past the verified tokens).

Published drafts for gpt-oss come in three layouts, all read by `Eagle3Config.from_dict` and
model/eagle3_weights.py, with names taken from the public sources:
- SpecForge (`lmsys/EAGLE3-gpt-oss-120b-bf16`, SpecForge's configs/gpt-oss-*-eagle3.json):
  `LlamaForCausalLMEagle3`, tensors `midlayer.*`, `fc`, `norm`, `lm_head`, `d2t`, `t2d`, layers from
  `eagle_config.eagle_aux_hidden_state_layer_ids` ([1, 11, 21] for the 20b, [1, 17, 33] for the 120b).
- NVIDIA ModelOpt (`nvidia/gpt-oss-120b-Eagle3`): the same names (its exporter renames `layers.0.*`
  to `midlayer.*`), often the full vocabulary and no `t2d`; a draft without `draft_vocab_size`
  uses the target's head (SGLang's rule), one without `lm_head` too.
- NVIDIA's Eagle3-v2 (the vLLM gpt-oss recipe's) sets `eagle_config.use_aux_hidden_state` false:
  no fc, the target's last hidden state (after its final norm) in place of the three.
- RedHat speculators (`Eagle3Speculator`): the Llama config nested under
  `transformer_layer_config`, tensors `layers.0.*`, and for gpt-oss `input_norm` ([3H], applied
  before fc) when `norm_before_fc`.
A draft without `embed_tokens` reads the target's embedding (SpecForge saves none).
Attention is plain causal over the draft's own paged KV cache (one layer on the target's
full-attention block tables): no sinks, no window, Llama RoPE.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from osserve.config import ModelConfig, YarnRope
from osserve.errors import ConfigError
from osserve.model.gpt_oss import FULL_GROUP, KVCache, RMSNorm
from osserve.ops.attention.dispatch import paged_attention
from osserve.ops.attention.metadata import AttentionMetadata
from osserve.ops.linear.dispatch import linear
from osserve.ops.norm.dispatch import add_rms_norm, rms_norm
from osserve.ops.rope.dispatch import qkv_rope_and_cache
from osserve.ops.rope.reference import RopeTable

ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3Speculator")
NO_SINK = -1e30  # the attention kernels' sink logit that takes no probability mass


@dataclass(frozen=True)
class Eagle3Config:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int  # the target's
    draft_vocab_size: int | None  # None: the target's head and vocabulary
    aux_layer_ids: tuple[int, ...]  # the target layers whose outputs feed fc; (): its last hidden state, no fc
    rms_norm_eps: float = 1e-5
    rope: YarnRope = YarnRope(theta=10000.0, factor=1.0)  # factor 1: plain RoPE
    norm_before_fc: bool = False  # speculators' gpt-oss drafts: RMSNorm over the [3H] input of fc
    norm_before_residual: bool = False  # the residual is hidden_norm's output, not its input
    attention_bias: bool = False

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @classmethod
    def from_dict(cls, raw: dict[str, Any], target: ModelConfig) -> Eagle3Config:
        """The three published layouts (module docstring); every mismatch with the target is a
        ConfigError naming the config.json key."""
        nested = raw.get("transformer_layer_config")
        layer: dict[str, Any] = nested if isinstance(nested, dict) else raw
        eagle = raw.get("eagle_config") or {}
        archs = raw.get("architectures") or []
        if not any(a in ARCHITECTURES for a in archs):
            raise ConfigError(f"draft config.json: 'architectures' is {archs}; osserve loads EAGLE3 drafts of one "
                              f"Llama layer ({', '.join(ARCHITECTURES)})", "architectures")

        def need(cond: bool, key: str, why: str) -> None:
            if not cond:
                raise ConfigError(f"draft config.json: '{key}' {why}", key)

        need(int(layer.get("num_hidden_layers", 1)) == 1, "num_hidden_layers",
             f"is {layer.get('num_hidden_layers')}: osserve runs single-layer EAGLE3 drafts")
        for key, want in (("use_input_layernorm_in_first_layer", True), ("use_last_layernorm", True),
                          ("use_mtp_layernorm", False)):
            need(eagle.get(key, want) == want, f"eagle_config.{key}", f"must be {str(want).lower()}")
        need(layer.get("hidden_act", "silu") == "silu", "hidden_act", "must be silu")
        need(not layer.get("mlp_bias", False), "mlp_bias", "must be false")
        hidden = int(layer.get("hidden_size", 0))
        need(hidden == target.hidden_size, "hidden_size",
             f"is {hidden} but the target model's hidden size is {target.hidden_size}")
        target_hidden = raw.get("target_hidden_size") or layer.get("target_hidden_size") or hidden
        need(int(target_hidden) == target.hidden_size, "target_hidden_size",
             f"is {target_hidden} but the target model's hidden size is {target.hidden_size}")
        vocab = int(layer.get("vocab_size", 0))
        need(vocab == target.vocab_size, "vocab_size",
             f"is {vocab} but the target model's vocabulary has {target.vocab_size} tokens")
        draft_vocab = raw.get("draft_vocab_size", layer.get("draft_vocab_size"))
        need(draft_vocab is None or 0 < int(draft_vocab) <= vocab, "draft_vocab_size",
             f"is {draft_vocab}: must be in 1..vocab_size")
        layers = raw.get("eagle_aux_hidden_state_layer_ids") or eagle.get("eagle_aux_hidden_state_layer_ids")
        ids = tuple(int(i) for i in layers) if layers else default_aux_layers(target.num_hidden_layers)
        if eagle.get("use_aux_hidden_state", True) is False:
            ids = ()  # NVIDIA's Eagle3-v2: the target's last (normed) hidden state, no fc
        need(len(ids) in (0, 3) and all(0 <= i < target.num_hidden_layers for i in ids),
             "eagle_config.eagle_aux_hidden_state_layer_ids",
             f"is {list(ids)}: three layers of the target's {target.num_hidden_layers}")
        heads = int(layer.get("num_attention_heads", 0))
        need(heads > 0, "num_attention_heads", "is missing")
        kv_heads = int(layer.get("num_key_value_heads", heads))
        need(heads % kv_heads == 0, "num_key_value_heads", "must divide num_attention_heads")
        head_dim = int(layer.get("head_dim") or hidden // heads)
        need(head_dim & (head_dim - 1) == 0, "head_dim", f"is {head_dim}: the attention kernels need a power of two")
        return cls(
            hidden_size=hidden, intermediate_size=int(layer["intermediate_size"]), num_attention_heads=heads,
            num_key_value_heads=kv_heads, head_dim=head_dim, vocab_size=vocab,
            draft_vocab_size=None if draft_vocab is None else int(draft_vocab), aux_layer_ids=ids,
            rms_norm_eps=float(layer.get("rms_norm_eps", 1e-5)), rope=_rope(layer),
            norm_before_fc=bool(raw.get("norm_before_fc", False)),
            norm_before_residual=bool(raw.get("norm_before_residual", layer.get("norm_before_residual", False))),
            attention_bias=bool(layer.get("attention_bias", False)),
        )

    def to_dict(self) -> dict[str, Any]:
        """config.json in SpecForge's layout (what `osserve checkpoint --preset eagle3` writes)."""
        eagle: dict[str, Any] = {"eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids)} if \
            self.aux_layer_ids else {"use_aux_hidden_state": False}
        return {
            "architectures": ["LlamaForCausalLMEagle3"],
            "eagle_config": eagle,
            "head_dim": self.head_dim, "hidden_act": "silu", "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "max_position_embeddings": 4096, "model_type": "llama",
            "num_attention_heads": self.num_attention_heads, "num_hidden_layers": 1,
            "num_key_value_heads": self.num_key_value_heads, "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope.theta, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "vocab_size": self.vocab_size, "draft_vocab_size": self.draft_vocab_size,
        }


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """SpecForge's choice when a draft names none: low, middle and high layers."""
    return (min(1, num_layers - 1), max(0, num_layers // 2 - 1), max(0, num_layers - 4))


def _rope(layer: dict[str, Any]) -> YarnRope:
    theta = float(layer.get("rope_theta", 10000.0))
    scaling = layer.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return YarnRope(theta=theta, factor=1.0)
    if kind == "yarn":
        return YarnRope(theta=theta, factor=float(scaling.get("factor", 1.0)),
                        original_max_position_embeddings=int(scaling.get("original_max_position_embeddings", 4096)),
                        beta_fast=float(scaling.get("beta_fast", 32.0)), beta_slow=float(scaling.get("beta_slow", 1.0)),
                        truncate=bool(scaling.get("truncate", False)))
    raise ConfigError(f"draft config.json: 'rope_scaling' of type {kind!r} is not supported (default or yarn)",
                      "rope_scaling")


class DraftAttention(nn.Module):
    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(2 * cfg.hidden_size, cfg.q_size, bias=bias)
        self.k_proj = nn.Linear(2 * cfg.hidden_size, cfg.kv_size, bias=bias)
        self.v_proj = nn.Linear(2 * cfg.hidden_size, cfg.kv_size, bias=bias)
        self.o_proj = nn.Linear(cfg.q_size, cfg.hidden_size, bias=bias)


class DraftMLP(nn.Module):
    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)


class DraftLayer(nn.Module):
    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg)
        self.mlp = DraftMLP(cfg)


class Eagle3Draft(nn.Module):
    """Parameter names are the checkpoint's (SpecForge's), so loading is name for name."""

    def __init__(self, cfg: Eagle3Config, fc_bias: bool = False, own_embedding: bool = False,
                 own_head: bool = True) -> None:
        super().__init__()
        self.config = cfg
        h = cfg.hidden_size
        self.fc = nn.Linear(3 * h, h, bias=fc_bias) if cfg.aux_layer_ids else None
        self.input_norm = RMSNorm(3 * h, cfg.rms_norm_eps) if cfg.norm_before_fc else None
        self.midlayer = DraftLayer(cfg)
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        head_rows = cfg.draft_vocab_size or cfg.vocab_size
        self.lm_head = nn.Linear(h, head_rows, bias=False) if own_head else None
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h) if own_embedding else None
        # target id = draft id + d2t[draft id]; None: the draft speaks the target's vocabulary.
        self.d2t = nn.Buffer(torch.zeros(cfg.draft_vocab_size, dtype=torch.int64)) if cfg.draft_vocab_size else None
        # Set by attach(): the target's tensors where the draft has none, the fused weights, RoPE.
        self.embedding: torch.Tensor | None = None
        self.head: torch.Tensor | None = None
        self.qkv_weight: torch.Tensor | None = None
        self.qkv_bias: torch.Tensor | None = None
        self.gate_up_weight: torch.Tensor | None = None
        self.rope: RopeTable | None = None
        self.sinks: torch.Tensor | None = None

    def attach(self, target_embedding: torch.Tensor, target_head: torch.Tensor, max_positions: int) -> None:
        """After loading, on the device: the target's embedding / head where the draft has none,
        q/k/v and gate/up as one GEMM each, the RoPE table for every position a request can reach."""
        attn, mlp = self.midlayer.self_attn, self.midlayer.mlp
        self.embedding = self.embed_tokens.weight if self.embed_tokens is not None else target_embedding
        self.head = self.lm_head.weight if self.lm_head is not None else target_head
        device = self.norm.weight.device
        with torch.no_grad():
            self.qkv_weight = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
            biases = [p.bias for p in (attn.q_proj, attn.k_proj, attn.v_proj)]
            self.qkv_bias = torch.cat([b if b is not None else torch.zeros(p.weight.shape[0], device=device,
                                                                             dtype=p.weight.dtype)
                                       for b, p in zip(biases, (attn.q_proj, attn.k_proj, attn.v_proj), strict=True)])
            self.gate_up_weight = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
        self.rope = RopeTable.build(self.config.rope, self.config.head_dim, max_positions, device)
        self.sinks = torch.full((self.config.num_attention_heads,), NO_SINK, dtype=torch.float32, device=device)

    def project(self, aux: torch.Tensor) -> torch.Tensor:
        """The target's concatenated hidden states [T, 3H] -> fc's output [T, H] (a draft without
        fc takes the target's last hidden state as it is)."""
        if self.fc is None:
            return aux
        if self.input_norm is not None:
            aux = rms_norm(aux, self.input_norm.weight, self.config.rms_norm_eps)
        return linear(aux, self.fc.weight, self.fc.bias)

    def forward(
        self,
        input_ids: torch.Tensor,  # [T] target-vocabulary ids
        hidden: torch.Tensor,  # [T, H]: project()'s output, or an earlier step's prenorm
        positions: torch.Tensor,  # [T] int64 RoPE positions
        meta: AttentionMetadata,  # over the draft's cache (the target's full-attention tables)
        kv_cache: KVCache,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(normed [T, H] for the head, prenorm [T, H] for the next draft step)."""
        cfg, layer = self.config, self.midlayer
        assert self.embedding is not None and self.qkv_weight is not None and self.qkv_bias is not None
        assert self.rope is not None and self.sinks is not None and self.gate_up_weight is not None
        eps, t = cfg.rms_norm_eps, input_ids.shape[0]
        embeds = rms_norm(self.embedding[input_ids], layer.input_layernorm.weight, eps)
        normed_hidden = rms_norm(hidden, layer.hidden_norm.weight, eps)
        residual = normed_hidden if cfg.norm_before_residual else hidden
        x = torch.cat([embeds, normed_hidden.to(embeds.dtype)], dim=-1)
        attn = layer.self_attn
        q = qkv_rope_and_cache(x, self.qkv_weight, self.qkv_bias, cfg.num_attention_heads, cfg.num_key_value_heads,
                               positions, self.rope, kv_cache, meta.groups[FULL_GROUP].slot_mapping)
        out = paged_attention(q, kv_cache, self.sinks, meta, meta.groups[FULL_GROUP], cfg.head_dim ** -0.5, None)
        a = linear(out.reshape(t, cfg.q_size), attn.o_proj.weight, attn.o_proj.bias)
        x, residual = add_rms_norm(a, residual.to(a.dtype), layer.post_attention_layernorm.weight, eps)
        gate, up = linear(x, self.gate_up_weight).chunk(2, dim=-1)
        m = linear(torch.nn.functional.silu(gate) * up, layer.mlp.down_proj.weight)
        return add_rms_norm(m, residual, self.norm.weight, eps)

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        """[T, H] -> [T, draft vocabulary] float32."""
        assert self.head is not None
        return linear(normed, self.head).float()

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids -> the target's (d2t holds the offsets)."""
        return draft_ids if self.d2t is None else draft_ids + self.d2t[draft_ids]
