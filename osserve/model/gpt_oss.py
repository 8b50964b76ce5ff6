"""The gpt-oss model as a plain nn.Module, built from a ModelConfig.

Module and parameter names mirror Hugging Face's checkpoint (`model.layers.N.self_attn.q_proj`,
`model.layers.N.mlp.experts.gate_up_proj_blocks`, ...), so loading is a name-for-name copy.

The forward takes a flat batch: T tokens from several sequences, their positions, the batch's
AttentionMetadata and one KVCache per layer (k and v; an FP8 cache's scales too). Prefill, chunked
prefill and decode are all this one call; the runner decides what goes in (see
engine/worker/runner.py). Compilation and CUDA graphs are applied by the runner, not here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from osserve.config import ModelConfig
from osserve.distributed.expert_routing import own_share
from osserve.ops.attention.dispatch import paged_attention
from osserve.ops.attention.kv_format import KVCache
from osserve.ops.attention.metadata import AttentionMetadata
from osserve.ops.dispatch import use_triton
from osserve.ops.linear.dispatch import linear, linear_float32
from osserve.ops.moe.dispatch import fused_moe, plan_block_m
from osserve.ops.moe.weights import ExpertWeights, PreparedExperts
from osserve.ops.norm.dispatch import add_rms_norm, embed_rms_norm
from osserve.ops.norm.reference import PendingTokens
from osserve.ops.rope.dispatch import qkv_rope_and_cache, rope_and_cache_table
from osserve.ops.rope.reference import RopeTable
from osserve.ops.router.counters import router_counters
from osserve.ops.router.dispatch import add_norm_route_with_plan

if TYPE_CHECKING:
    from osserve.distributed.collectives import RankGroup
    from osserve.distributed.layout import ShardLayout
    from osserve.ops.linear.head_triton import HostIds

SLIDING_GROUP = "sliding"
FULL_GROUP = "full"


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps


class Attention(nn.Module):
    """GQA attention with learned sinks; sliding-window layers see the last `window` tokens. On a
    rank of several (distributed/layout.py) its heads are the rank's, and o_proj's output is its
    partial sum, for the all-reduce after it."""

    def __init__(self, cfg: ModelConfig, layer_idx: int, layout: ShardLayout | None = None) -> None:
        super().__init__()
        local = layout.local_config(cfg) if layout is not None else cfg
        self.num_heads = local.num_attention_heads
        self.num_kv_heads = local.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, local.q_size, bias=True)
        self.k_proj = nn.Linear(cfg.hidden_size, local.kv_size, bias=True)
        self.v_proj = nn.Linear(cfg.hidden_size, local.kv_size, bias=True)
        self.o_proj = nn.Linear(local.q_size, cfg.hidden_size, bias=True)
        self.sinks = nn.Parameter(torch.empty(local.num_attention_heads))
        self.qkv_sizes = [local.q_size, local.kv_size, local.kv_size]
        # One rank: o_proj may leave K-split partials for the next norm to sum. Several: the
        # all-reduce takes o_proj's output as one [T, hidden] tensor.
        self.partial_output = layout is None
        # q, k and v as one weight (fuse_qkv, at load); None until then.
        self.qkv_weight: torch.Tensor | None
        self.qkv_bias: torch.Tensor | None
        self.register_buffer("qkv_weight", None, persistent=False)
        self.register_buffer("qkv_bias", None, persistent=False)
        self.window = cfg.window_of(layer_idx)
        self.group = SLIDING_GROUP if self.window is not None else FULL_GROUP
        self.scale = cfg.head_dim**-0.5

    def forward(
        self,
        x: torch.Tensor,  # [T, hidden]
        positions: torch.Tensor,  # [T] int64
        rope: RopeTable,
        meta: AttentionMetadata,
        kv_cache: KVCache,
    ) -> torch.Tensor:
        t = x.shape[0]
        tables = meta.groups[self.group]
        if self.qkv_weight is not None:  # at decode sizes one kernel: projection, RoPE, cache write
            assert self.qkv_bias is not None
            q = qkv_rope_and_cache(x, self.qkv_weight, self.qkv_bias, self.num_heads, self.num_kv_heads,
                                   positions, rope, kv_cache, tables.slot_mapping)
        else:
            q, k, v = (linear(x, p.weight, p.bias) for p in (self.q_proj, self.k_proj, self.v_proj))
            q, _ = rope_and_cache_table(q.view(t, self.num_heads, self.head_dim),
                                        k.view(t, self.num_kv_heads, self.head_dim),
                                        v.view(t, self.num_kv_heads, self.head_dim),
                                        positions, rope, kv_cache, tables.slot_mapping)
        out = paged_attention(q, kv_cache, self.sinks, meta, tables, self.scale, self.window)
        # Unreduced where the kernel splits K: the next add_rms_norm sums the partials.
        return linear(out.reshape(t, self.num_heads * self.head_dim), self.o_proj.weight, self.o_proj.bias,
                      reduce=not self.partial_output)

    def fuse_qkv(self) -> None:
        """One [q + 2·kv, hidden] weight for the three projections: one GEMM instead of three. At
        decode each was a launch-bound GEMV (H100, bench_linear.py: cuBLAS 26.4 µs per layer for
        the three at batch 1, 13.7 fused). q_proj, k_proj and v_proj keep their names and now hold
        views of the fused tensors, so state_dict and the memory used are unchanged."""
        projections = (self.q_proj, self.k_proj, self.v_proj)
        with torch.no_grad():
            weight = torch.cat([p.weight for p in projections])
            bias = torch.cat([p.bias for p in projections])
        for p, w, b in zip(projections, weight.split(self.qkv_sizes), bias.split(self.qkv_sizes), strict=True):
            p.weight.data, p.bias.data = w, b
        self.qkv_weight, self.qkv_bias = weight, bias


class Experts(nn.Module):
    """The experts of one layer, kept as stored: MXFP4 blocks and scales plus biases (on a rank of
    several, its experts or its columns of each: distributed/layout.py)."""

    def __init__(self, cfg: ModelConfig, layout: ShardLayout | None = None) -> None:
        super().__init__()
        e, h, i = cfg.num_local_experts, cfg.hidden_size, cfg.intermediate_size
        if layout is not None:
            e, i = len(layout.experts), layout.intermediate
        u8 = torch.uint8
        self.gate_up_proj_blocks = nn.Buffer(torch.empty(e, 2 * i, h // 32, 16, dtype=u8))
        self.gate_up_proj_scales = nn.Buffer(torch.empty(e, 2 * i, h // 32, dtype=u8))
        self.gate_up_proj_bias = nn.Parameter(torch.empty(e, 2 * i))
        self.down_proj_blocks = nn.Buffer(torch.empty(e, h, i // 32, 16, dtype=u8))
        self.down_proj_scales = nn.Buffer(torch.empty(e, h, i // 32, dtype=u8))
        self.down_proj_bias = nn.Parameter(torch.empty(e, h))
        self.prepared: PreparedExperts | None = None  # the fused kernel's layout (GPU, at load)

    def weights(self) -> ExpertWeights:
        freed = self.gate_up_proj_blocks.numel() == 0  # prepare_experts dropped the checkpoint layout
        return ExpertWeights(
            gate_up_blocks=None if freed else self.gate_up_proj_blocks,
            gate_up_scales=None if freed else self.gate_up_proj_scales,
            gate_up_bias=self.gate_up_proj_bias,
            down_blocks=None if freed else self.down_proj_blocks,
            down_scales=None if freed else self.down_proj_scales,
            down_bias=self.down_proj_bias,
            prepared=self.prepared,
        )


class MLP(nn.Module):
    """Router (top-k, softmax after top-k) and clamped-SwiGLU experts. On a rank of several the
    router is whole and the output is the rank's partial sum (all-reduced by the caller); with
    expert parallelism the rank runs only its own experts' share of each token's choices."""

    def __init__(self, cfg: ModelConfig, layout: ShardLayout | None = None) -> None:
        super().__init__()
        self.router = nn.Linear(cfg.hidden_size, cfg.num_local_experts, bias=True)
        self.experts = Experts(cfg, layout)
        self.partial_output = layout is None  # as Attention's
        self.own_experts = layout.experts if layout is not None and layout.expert_parallel else None
        self.top_k = cfg.num_experts_per_tok
        self.swiglu_limit = cfg.swiglu_limit
        # The fused small-batch router's scratch: zero at rest, left zero by each call, so it
        # must be zeroed once on the device (build_buffers) and never saved.
        self.router_counters = nn.Buffer(router_counters(torch.get_default_device()), persistent=False)

    def forward(self, a: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """The post-attention residual add + RMSNorm (weight norm_weight), then the experts on its
        rows: (their output, the new residual). At decode the router's kernel also takes the norm
        and builds the MoE's routing plan (two launches fewer), and the MoE leaves its rows
        unreduced for the next add_rms_norm to sum (one more)."""
        experts = self.experts.weights()
        if self.own_experts is not None:  # the router's plan would be over every expert: none wanted
            x, residual, weights, ids, _ = add_norm_route_with_plan(
                a, residual, norm_weight, eps, self.router.weight, self.router.bias, self.top_k,
                self.router_counters, None)
            weights, ids = own_share(weights, ids, self.own_experts)
            return fused_moe(x, weights, ids, experts, self.swiglu_limit), residual
        x, residual, weights, ids, plan = add_norm_route_with_plan(
            a, residual, norm_weight, eps, self.router.weight, self.router.bias, self.top_k, self.router_counters,
            plan_block_m(experts, residual.shape[0], self.top_k))
        return fused_moe(x, weights, ids, experts, self.swiglu_limit, reduce=not self.partial_output,
                         plan=plan), residual


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, layout: ShardLayout | None = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer_idx, layout)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg, layout)
        self.eps = cfg.rms_norm_eps
        # The ranks' group, set by GptOssForCausalLM.join (None: one rank, no all-reduce).
        self.group: RankGroup | None = None

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor,
        positions: torch.Tensor,
        rope: RopeTable,
        meta: AttentionMetadata,
        kv_cache: KVCache,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the input norm's rows (applied by the model, fused with the step before it: the
        embedding's gather or the last layer's residual add); residual: the stream they came from.
        Returns (this layer's MLP output, the residual stream before it): the next norm adds the two."""
        a = self.self_attn(x, positions, rope, meta, kv_cache)
        if self.group is None:
            return self.mlp(a, residual, self.post_attention_layernorm.weight, self.eps)
        # Several ranks: a plain all-reduce of each partial sum; the add + RMSNorm after it stay
        # the one-rank kernels (fusing them into the all-reduce, as SGLang does, is not done yet).
        h, residual = self.mlp(self.group.all_reduce(a), residual, self.post_attention_layernorm.weight, self.eps)
        return self.group.all_reduce(h), residual


class GptOssModel(nn.Module):
    def __init__(self, cfg: ModelConfig, layout: ShardLayout | None = None) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, layout) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class GptOssForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, layout: ShardLayout | None = None) -> None:
        """layout: the part of the model this rank holds when several ranks share it (config stays
        the whole model's: the checkpoint's names and shapes)."""
        super().__init__()
        self.config = cfg
        self.layout = layout
        self.model = GptOssModel(cfg, layout)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.build_buffers()

    def join(self, group: RankGroup) -> None:
        """Sum each layer's partial attention and MoE outputs over `group`'s ranks (one all-reduce
        after each), as a model built with a ShardLayout must."""
        layers: list[DecoderLayer] = list(self.model.layers)  # type: ignore[arg-type]
        for layer in layers:
            layer.group = group

    def build_buffers(self, device: torch.device | str | None = None) -> None:
        """(Re)make the non-persistent buffers on `device`: the RoPE cos/sin table for every
        position the config allows, and zeroed router counters (default: the current default
        device, so a model built under `torch.device("meta")` costs nothing until `build_model`
        calls this again on the real device, after `to_empty` left them uninitialised).

        They are not checkpoint tensors: `.to(device)` moves them, `state_dict` leaves them out,
        and CUDA graphs see fixed addresses. The table's rows are exactly what the per-step
        `rope_cos_sin(positions, ...)` gave, so outputs are unchanged."""
        cfg = self.config
        device = device if device is not None else torch.get_default_device()
        table = RopeTable.build(cfg.rope, cfg.head_dim, cfg.max_position_embeddings, device)
        self.rope_cos = nn.Buffer(table.cos, persistent=False)
        self.rope_sin = nn.Buffer(table.sin, persistent=False)
        for module in self.modules():
            if isinstance(module, MLP):
                module.router_counters = nn.Buffer(router_counters(device), persistent=False)

    @property
    def rope_table(self) -> RopeTable:
        return RopeTable(self.rope_cos, self.rope_sin)

    def forward(
        self,
        input_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64
        meta: AttentionMetadata,
        kv_caches: list[KVCache],  # one per layer
        pending: PendingTokens | None = None,  # ids still on the device (async scheduling)
    ) -> torch.Tensor:
        """Returns the final hidden states [T, hidden] (logits only where the runner asks).
        Each layer's input norm (and the final one) runs here, fused with what comes before it:
        the embedding's gather for the first, the residual add of the layer before for the rest."""
        layers: list[DecoderLayer] = list(self.model.layers)  # type: ignore[arg-type]
        eps = self.config.rms_norm_eps
        rope = self.rope_table  # positions must be < max_position_embeddings
        norms = [layer.input_layernorm.weight for layer in layers] + [self.model.norm.weight]
        x, residual = embed_rms_norm(input_ids, self.model.embed_tokens.weight, norms[0], eps, pending)
        for layer, kv, norm in zip(layers, kv_caches, norms[1:], strict=True):
            h, residual = layer(x, residual, positions, rope, meta, kv)
            x, residual = add_rms_norm(h, residual, norm, eps)
        return x

    def forward_capturing(
        self,
        input_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
        layers_to_capture: tuple[int, ...],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """forward(), also returning the residual stream after each layer in `layers_to_capture`
        (the output of layer k, before any norm: EAGLE3's auxiliary hidden states, in SGLang's and
        SpecForge's numbering), concatenated: [T, len(layers_to_capture) * hidden]. A loop of its
        own, so the plain forward does no work for it."""
        layers: list[DecoderLayer] = list(self.model.layers)  # type: ignore[arg-type]
        eps = self.config.rms_norm_eps
        rope = self.rope_table
        norms = [layer.input_layernorm.weight for layer in layers] + [self.model.norm.weight]
        x, residual = embed_rms_norm(input_ids, self.model.embed_tokens.weight, norms[0], eps)
        captured: dict[int, torch.Tensor] = {}
        for k, (layer, kv, norm) in enumerate(zip(layers, kv_caches, norms[1:], strict=True)):
            h, residual = layer(x, residual, positions, rope, meta, kv)
            x, residual = add_rms_norm(h, residual, norm, eps)  # residual: layer k's output
            if k in layers_to_capture:
                captured[k] = residual
        return x, torch.cat([captured[k] for k in layers_to_capture], dim=-1)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> logits [N, vocab] in float32 (not rounded to the model's dtype first
        on a GPU: linear_float32)."""
        return linear_float32(hidden, self.lm_head.weight)

    def compute_logits_and_greedy(self, hidden: torch.Tensor, greedy_out: torch.Tensor | None = None,
                                  host_out: HostIds | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(the logits of hidden, their argmax [N] int64 where it comes with them, else None), for
        the sampler. At decode sizes on the GPU one kernel writes the float32 logits and argmax
        partials, and a second picks the ids (ops/linear/head_triton.py), into greedy_out and
        host_out where given; elsewhere the logits are the GEMM's, in the model's dtype: the values
        compute_logits widens to float32, left narrow because the sampler's common paths (argmax,
        the fused temperature race, grammar masks) read them as they are, and widening 201,088
        logits a row took a pass of its own (H200, batch 256: ~150 us of an ~11.7 ms 20b step).
        The sampler takes its own argmax where it needs one (and host_out is not written)."""
        if use_triton(hidden):
            from osserve.ops.linear.head_triton import fits_logits_triton, logits_and_greedy_triton

            if fits_logits_triton(hidden, self.lm_head.weight):
                return logits_and_greedy_triton(hidden, self.lm_head.weight, greedy_out=greedy_out,
                                                host_out=host_out)
        return linear(hidden, self.lm_head.weight), None

    def fuse_qkv(self) -> None:
        """Every layer's q/k/v projections as one GEMM (Attention.fuse_qkv)."""
        for layer in self.model.layers:
            attn: Attention = layer.self_attn  # type: ignore[assignment]
            attn.fuse_qkv()

    def prepare_experts(self, keep_original: bool, fragments: bool = False) -> list[PreparedExperts]:
        """Give every layer's experts the fused kernel's layout (once, at load, on the GPU); returns
        them by layer. Without keep_original the checkpoint-layout tensors are freed (the 120b
        cannot hold both); the reference and dense-prefill paths then have no weights to read."""
        from osserve.ops.moe.layout import prepare_mxfp4_experts

        prepared = []
        for layer in self.model.layers:
            ex: Experts = layer.mlp.experts  # type: ignore[union-attr,assignment]
            ex.prepared = prepare_mxfp4_experts(ex.weights(), fragments=fragments)
            prepared.append(ex.prepared)
            if not keep_original:
                empty = nn.Buffer(torch.empty(0, dtype=torch.uint8, device=ex.gate_up_proj_blocks.device))
                ex.gate_up_proj_blocks = ex.gate_up_proj_scales = empty
                ex.down_proj_blocks = ex.down_proj_scales = empty
        return prepared
