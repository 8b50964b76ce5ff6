"""The demo model in training form: osserve's own gpt-oss modules and ops, run with autograd.

The served model (model/gpt_oss.py) keeps experts as MXFP4 and reads K/V through a paged cache;
neither can be trained. Here the same GptOssForCausalLM holds every other weight, the experts are
float parameters beside it (fake-quantised to MXFP4 with a straight-through gradient once
`quantize_experts` is set, so the model learns weights that survive 4-bit export), and attention
runs on a dense padded batch. Every op is the serving path's reference op (rms_norm, YaRN RoPE,
the router's top-k-then-softmax, clamped SwiGLU), and attention is the same function as
`paged_attention_reference` (sink column in the softmax, sliding window): a test checks that the
exported checkpoint, served, gives these logits.

The vocabulary is compact: only the tokens the corpus uses get rows. The served model has all
201,088 rows, the others zero, so those tokens' logits are exactly 0; the loss counts them as
one extra column of logit log(#unused), which is the same softmax.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import nn

from osserve.config import ModelConfig
from osserve.model.gpt_oss import MLP, DecoderLayer, GptOssForCausalLM
from osserve.ops.moe.reference import moe_dense_reference
from osserve.ops.mxfp4.reference import dequantize_mxfp4, quantize_mxfp4
from osserve.ops.norm.reference import rms_norm_reference
from osserve.ops.rope.reference import apply_rope
from osserve.ops.router.reference import route_reference

# The demo architecture: gpt-oss's structure (alternating 128-token sliding window and full
# attention, sinks, GQA, YaRN RoPE, top-k MoE with clamped SwiGLU, MXFP4 experts) at a size
# that trains in minutes and ships in a few MB.
DEMO_CONFIG = ModelConfig(
    hidden_size=256,
    intermediate_size=256,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=64,
    num_local_experts=4,
    num_experts_per_tok=2,
)


def fake_quantize_mxfp4(w: torch.Tensor) -> torch.Tensor:
    """w rounded to MXFP4 in the forward, the identity in the backward (straight-through)."""
    blocks, scales = quantize_mxfp4(w)
    return w + (dequantize_mxfp4(blocks, scales, w.dtype) - w).detach()


def dense_attention(
    q: torch.Tensor,  # [B, S, H, D]
    k: torch.Tensor,  # [B, S, KVH, D]
    v: torch.Tensor,
    sinks: torch.Tensor,  # [H]
    scale: float,
    window: int | None,
) -> torch.Tensor:
    """Causal attention over whole sequences with sinks and an optional sliding window."""
    b, s, h, d = q.shape
    group = h // k.shape[2]
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * scale
    pos = torch.arange(s, device=q.device)
    dist = pos[:, None] - pos[None, :]
    visible = dist >= 0
    if window is not None:
        visible &= dist < window
    scores = scores.masked_fill(~visible, float("-inf"))
    sink_col = sinks.float()[None, :, None, None].expand(b, h, s, 1)
    probs = torch.softmax(torch.cat((scores, sink_col), dim=-1), dim=-1)[..., :-1]
    return torch.einsum("bhqk,bkhd->bqhd", probs, v.float()).to(q.dtype)


class DemoTrainable(nn.Module):
    def __init__(self, cfg: ModelConfig, vocab: list[int], full_vocab_size: int) -> None:
        super().__init__()
        self.vocab = vocab  # compact id -> token id
        self.full_vocab_size = full_vocab_size
        self.cfg = replace(cfg, vocab_size=len(vocab))
        self.net = GptOssForCausalLM(self.cfg)
        e, i, h = cfg.num_local_experts, cfg.intermediate_size, cfg.hidden_size
        self.gate_up = nn.ParameterList(nn.Parameter(torch.empty(e, 2 * i, h)) for _ in range(cfg.num_hidden_layers))
        self.down = nn.ParameterList(nn.Parameter(torch.empty(e, h, i)) for _ in range(cfg.num_hidden_layers))
        self.quantize_experts = False

    @property
    def served_config(self) -> ModelConfig:
        """The config of the expanded checkpoint: the full vocabulary."""
        return replace(self.cfg, vocab_size=self.full_vocab_size)

    def init_weights(self, generator: torch.Generator) -> None:
        """GPT-2-style init: N(0, 0.02), output projections scaled down by the depth."""
        out_std = 0.02 / math.sqrt(2 * self.cfg.num_hidden_layers)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                    p.fill_(1.0)
                elif name.endswith("bias") or name.endswith("sinks"):
                    p.zero_()
                elif name.endswith("embed_tokens.weight"):
                    p.normal_(0, 1.0, generator=generator)
                elif "o_proj" in name or name.startswith("down"):
                    p.normal_(0, out_std, generator=generator)
                else:
                    p.normal_(0, 0.02, generator=generator)

    def experts(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        w1: torch.Tensor = self.gate_up[layer]
        w2: torch.Tensor = self.down[layer]
        if self.quantize_experts:
            return fake_quantize_mxfp4(w1), fake_quantize_mxfp4(w2)
        return w1, w2

    def forward(self, ids: torch.Tensor, layer_outputs: list[torch.Tensor] | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Compact ids [B, S] -> (final hidden states [B, S, hidden], router balance loss).
        layer_outputs: a list to append each layer's output (the residual stream) to (the EAGLE3
        draft trains on them: demo/train_draft.py)."""
        cfg, net = self.cfg, self.net
        b, s = ids.shape
        h = net.model.embed_tokens(ids)
        cos, sin = net.rope_cos[:s], net.rope_sin[:s]  # the served model's YaRN table
        balance = h.new_zeros(())
        layers: list[DecoderLayer] = list(net.model.layers)  # type: ignore[arg-type]
        for n, layer in enumerate(layers):
            att = layer.self_attn
            x = rms_norm_reference(h, layer.input_layernorm.weight, cfg.rms_norm_eps)
            q = apply_rope(att.q_proj(x).view(b * s, cfg.num_attention_heads, -1), cos.repeat(b, 1), sin.repeat(b, 1))
            k = apply_rope(att.k_proj(x).view(b * s, cfg.num_key_value_heads, -1), cos.repeat(b, 1), sin.repeat(b, 1))
            v = att.v_proj(x).view(b, s, cfg.num_key_value_heads, -1)
            o = dense_attention(q.view(b, s, *q.shape[1:]), k.view(b, s, *k.shape[1:]), v, att.sinks, att.scale,
                                att.window)
            h = h + att.o_proj(o.reshape(b, s, -1))
            x = rms_norm_reference(h, layer.post_attention_layernorm.weight, cfg.rms_norm_eps)
            y, bal = self._moe(n, x.view(b * s, -1))
            h = h + y.view(b, s, -1)
            balance = balance + bal
            if layer_outputs is not None:
                layer_outputs.append(h)
        out = rms_norm_reference(h, net.model.norm.weight, cfg.rms_norm_eps)
        return out, balance / cfg.num_hidden_layers

    def _moe(self, n: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The experts of layer n (the reference op on the float weights) and a Switch-style balance
        loss (E * sum_e tokens_share_e * mean_router_prob_e; 1.0 when perfectly balanced)."""
        mlp: MLP = self.net.model.layers[n].mlp  # type: ignore[assignment]
        weights, ids = route_reference(x, mlp.router.weight, mlp.router.bias, self.cfg.num_experts_per_tok)
        w1, w2 = self.experts(n)
        out = moe_dense_reference(x, weights, ids, w1, mlp.experts.gate_up_proj_bias, w2, mlp.experts.down_proj_bias,
                                  self.cfg.swiglu_limit)
        e_count = self.cfg.num_local_experts
        probs = torch.softmax(nn.functional.linear(x, mlp.router.weight, mlp.router.bias), dim=-1)
        share = torch.bincount(ids.flatten(), minlength=e_count).float() / ids.numel()
        return out, e_count * (share * probs.mean(0)).sum()

    def loss(self, ids: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-entropy over the full vocabulary at the masked positions, and the balance loss."""
        hidden, balance = self(ids)
        logits = self.net.lm_head(hidden[mask])  # [N, V_used]
        unused = math.log(self.full_vocab_size - len(self.vocab))
        logits = torch.cat((logits, logits.new_full((logits.shape[0], 1), unused)), dim=-1)
        return nn.functional.cross_entropy(logits, targets[mask]), balance


def trainable_from_compact(path: str, device: str = "cpu") -> DemoTrainable:
    """The shipped demo model (demo/compact.py's file) back in training form, its MXFP4 experts
    dequantised: what the draft trains on (demo/train_draft.py)."""
    from safetensors.torch import load_file

    tensors = load_file(path)
    vocab = tensors.pop("vocab").tolist()
    model = DemoTrainable(DEMO_CONFIG, vocab, DEMO_CONFIG.vocab_size)
    state = model.net.state_dict()
    with torch.no_grad():
        for name, t in tensors.items():
            if "mlp.experts." in name and name.endswith(("_blocks", "_scales")):
                continue
            state[name].copy_(t.float())
        for n in range(DEMO_CONFIG.num_hidden_layers):
            x = f"model.layers.{n}.mlp.experts."
            for name, param in (("gate_up_proj", model.gate_up[n]), ("down_proj", model.down[n])):
                param.copy_(dequantize_mxfp4(tensors[x + name + "_blocks"], tensors[x + name + "_scales"]))
    return model.to(device).eval().requires_grad_(False)
