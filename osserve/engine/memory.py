"""The GPU memory plan's arithmetic, apart from any device: what the weights take, what is kept free
for a step's activations and the CUDA graphs, what is left for the KV cache, and whether a model fits
a card at all. engine/load.py feeds it the driver's figures; tests and `benchmarks/memory_plans.py`
feed it a card's size (a 24 GB A10, an 80 GB H100) and get the same answers without one.

A model that cannot fit is refused before a byte of it is allocated, with one line naming the
shortfall; an out-of-memory traceback from the middle of loading says nothing a user can act on.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from osserve.config import DEFAULT_BATCHED_TOKENS, CacheConfig, ModelConfig, SchedulerConfig
from osserve.engine.worker.kv_tensors import KVPlan, bytes_per_block, plan_kv_cache, sliding_blocks_needed
from osserve.errors import ConfigError
from osserve.model.gpt_oss import FULL_GROUP
from osserve.model.weights import checkpoint_layout

GiB = 2**30
# Kept free beside the weights and the KV cache: the CUDA graphs' pool (0.28 GiB measured with the
# 120b), cuBLAS's and Triton's workspaces, and the largest step's activations, which grow with its
# tokens: at max_num_batched_tokens 8192 the MoE's expert rows (8192 x 4 x 2880, bf16 or fp32 split
# partials: 0.19-0.38 GB each for the activations and the outputs), attention's q/k/v and output
# (0.2 GB) and the residual stream; 256 KiB a token is about twice what they add up to. 3 GiB at
# 8192 tokens, the figure every H100 serving measurement so far ran with; 5 GiB at 16384
# (default_batched_tokens below); 1.5 GiB at 2048, the lever a 24 GB card has to trade prompt chunk
# size for KV cache.
WORKSPACE_FIXED_BYTES = 1 * GiB
WORKSPACE_BYTES_PER_TOKEN = 256 * 1024
# A smaller card on a larger one, for tests and benchmarks (benchmarks/portable_ab.py: an A10's 24 GB on
# the H100): the plan takes this size for the card's, and PyTorch's allocator is held to it.
SIMULATED_GPU_ENV = "OSSERVE_GPU_MEMORY_GB"


@dataclass(frozen=True)
class DeviceMemory:
    """What the plan knows of a GPU: its name, its size, and what was in use before the model (this
    process's CUDA context, other processes)."""

    name: str
    total: int
    in_use: int


def simulated_gpu_bytes() -> int | None:
    value = os.environ.get(SIMULATED_GPU_ENV)
    if not value:
        return None
    try:
        return int(float(value) * GiB)
    except ValueError:
        raise ConfigError(f"{SIMULATED_GPU_ENV}={value!r}: expected GiB, e.g. 22.2", "device") from None


def workspace_bytes(max_num_batched_tokens: int) -> int:
    return WORKSPACE_FIXED_BYTES + WORKSPACE_BYTES_PER_TOKEN * max_num_batched_tokens


def checkpoint_bytes(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """The model's weights as loaded (model/weights.py's layout): bf16 tensors in `dtype`, MXFP4 bytes as they are."""
    total = 0
    for shape, stored in checkpoint_layout(cfg).values():
        total += math.prod(shape) * (1 if stored == torch.uint8 else dtype.itemsize)
    return total


def expert_bytes(cfg: ModelConfig) -> int:
    """The MXFP4 experts' blocks and scales, all layers: the part the kernels' layout copies."""
    h, i, e = cfg.hidden_size, cfg.intermediate_size, cfg.num_local_experts
    values = cfg.num_hidden_layers * e * 3 * h * i  # gate_up [2I, H] and down [H, I]
    return values // 2 + values // 32  # 4 bits a value, a scale byte per 32


def derived_bytes(cfg: ModelConfig) -> int:
    """What load adds to the checkpoint's tensors: the kernels' float32 expert biases
    (ops/moe/layout.py) and the RoPE cos/sin table for every position (model/gpt_oss.py)."""
    biases = cfg.num_hidden_layers * cfg.num_local_experts * (2 * cfg.intermediate_size + cfg.hidden_size) * 4
    return biases + 2 * cfg.max_position_embeddings * (cfg.head_dim // 2) * 4


def keep_checkpoint_experts(weights: int, total: int) -> bool:
    """Keep the checkpoint-layout experts beside the kernels' layout (for the dense prefill path)
    only where both fit comfortably: the 20b on an 80 GB GPU yes, on a 24 or 40 GB one no, the 120b
    on one 80 GB GPU no."""
    return 2 * weights < 0.6 * total


def resident_weights(cfg: ModelConfig, dtype: torch.dtype, total: int) -> int:
    """The weights' bytes once the kernels' layout exists: the checkpoint's and derived_bytes, plus
    the experts again where keep_checkpoint_experts holds."""
    weights = checkpoint_bytes(cfg, dtype)
    kept = expert_bytes(cfg) if keep_checkpoint_experts(weights, total) else 0
    return weights + derived_bytes(cfg) + kept


def kv_budget(device: DeviceMemory, used_now: int, utilization: float, workspace: int) -> int:
    """What --gpu-memory-utilization leaves the KV cache: total x utilization, less what is in use
    now (weights included) and the workspace."""
    return max(0, int(device.total * utilization) - used_now - workspace)


# The step budget where --max-num-batched-tokens is not given, on a GPU. Measured on one H100 (20b,
# prefill of 8 x 2048 prompts): 70,909 tok/s with 16384 tokens a step (BENCHMARKS.md), 38-49k with
# 8192 (issue 38). Above 4096 tokens the MoE takes the dense path (ops/moe/dense.py: the layer's
# experts dequantised once a step, then grouped GEMMs), whose fixed cost a 16384-token step spreads
# over twice the tokens (its grouped GEMMs since 2026-11-27: 77k tok/s against 70k, its bf16 copies ~1
# GiB more at the step's peak, within the workspace kept free); without the checkpoint-layout experts
# (keep_checkpoint_experts) there is no dense path and nothing measured to gain. The larger budget
# keeps 2 GiB more free for its activations: ~4% of the 20b's cache on an 80 GB card (45 GiB as
# planned), but 23% of the 120b's there (8.79 GiB, 192,128 tokens, measured at
# --gpu-memory-utilization 0.97; plan_kv_cache gives 140,416 tokens for 2 GiB less). So it is taken
# where that costs at most LARGE_BUDGET_KV_SHARE of the cache the smaller budget would leave.
BATCHED_TOKENS = DEFAULT_BATCHED_TOKENS  # SchedulerConfig's own default
LARGE_BATCHED_TOKENS = 16384
LARGE_BUDGET_KV_SHARE = 0.10
CUDA_CONTEXT_BYTES = GiB // 2  # in use before the model, as benchmarks/memory_plans.py assumes


def default_batched_tokens(cfg: ModelConfig, cache: CacheConfig, dtype: torch.dtype, total: int,
                           ranks: int = 1) -> int:
    """LARGE_BATCHED_TOKENS where the dense prefill path exists and the larger workspace takes at most
    LARGE_BUDGET_KV_SHARE of the KV cache that BATCHED_TOKENS would leave on a card of `total` bytes,
    else BATCHED_TOKENS. From the card's size and the model alone (weights split evenly over `ranks`),
    so every rank of a tensor-parallel engine picks the same; a KV cache sized by hand (--kv-cache-gb,
    a block count) keeps BATCHED_TOKENS."""
    if cache.kv_cache_gb is not None or cache.num_blocks is not None:
        return BATCHED_TOKENS
    if not keep_checkpoint_experts(checkpoint_bytes(cfg, dtype) // ranks, total):
        return BATCHED_TOKENS
    weights = resident_weights(cfg, dtype, total) // ranks
    device = DeviceMemory("", total, CUDA_CONTEXT_BYTES)
    kv = kv_budget(device, CUDA_CONTEXT_BYTES + weights, cache.gpu_memory_utilization, workspace_bytes(BATCHED_TOKENS))
    extra = workspace_bytes(LARGE_BATCHED_TOKENS) - workspace_bytes(BATCHED_TOKENS)
    return LARGE_BATCHED_TOKENS if extra <= LARGE_BUDGET_KV_SHARE * kv else BATCHED_TOKENS


def minimum_kv_bytes(cfg: ModelConfig, cache: CacheConfig, sched: SchedulerConfig, kv_dtype: torch.dtype) -> int:
    """The smallest useful cache: every running sequence's sliding window, and one request of
    max_model_len tokens in the full-attention layers (kv_dtype: the cache's, --kv-cache-dtype)."""
    per_block = bytes_per_block(cfg, cache.block_size, kv_dtype)
    need = math.ceil(sched.max_model_len / cache.block_size) * per_block.get(FULL_GROUP, 0)
    if len(per_block) > 1 or FULL_GROUP not in per_block:
        sliding = next(g for g in per_block if g != FULL_GROUP)
        need += sliding_blocks_needed(cfg, cache, sched) * per_block[sliding]
    return need


def refuse_if_too_small(model: str, cfg: ModelConfig, cache: CacheConfig, sched: SchedulerConfig,
                        dtype: torch.dtype, device: DeviceMemory, kv_dtype: torch.dtype | None = None) -> None:
    """ConfigError, one line, where the weights, the workspace and the smallest useful KV cache do
    not fit what --gpu-memory-utilization leaves of the card (before anything is allocated).
    dtype: the weights'; kv_dtype: the cache's (default the same)."""
    weights = resident_weights(cfg, dtype, device.total)
    workspace = workspace_bytes(sched.max_num_batched_tokens)
    kv = minimum_kv_bytes(cfg, cache, sched, kv_dtype or dtype)
    needed = weights + workspace + kv
    available = int(device.total * cache.gpu_memory_utilization) - device.in_use
    if needed <= available:
        return
    hint = ("a larger GPU" if weights + workspace > available
            else "a smaller --max-model-len or --max-num-seqs, or a higher --gpu-memory-utilization")
    raise ConfigError(
        f"{model} does not fit {device.name} ({device.total / GiB:.2f} GiB): it needs {needed / GiB:.2f} GiB "
        f"(weights {weights / GiB:.2f} + workspace {workspace / GiB:.2f} + KV cache for one "
        f"{sched.max_model_len:,}-token request and {sched.max_num_seqs} sliding windows {kv / GiB:.2f}), "
        f"--gpu-memory-utilization {cache.gpu_memory_utilization:.2f} leaves {available / GiB:.2f} GiB "
        f"({device.in_use / GiB:.2f} GiB already in use): {(needed - available) / GiB:.2f} GiB short; "
        f"try {hint}", "gpu_memory_utilization")


def refuse_small_kv_budget(budget: int, cfg: ModelConfig, cache: CacheConfig, sched: SchedulerConfig,
                           kv_dtype: torch.dtype) -> None:
    """ConfigError, one line, where the KV budget measured after loading cannot hold the smallest
    useful cache (minimum_kv_bytes): refuse_if_too_small's check with the driver's own figures."""
    need = minimum_kv_bytes(cfg, cache, sched, kv_dtype)
    if budget >= need:
        return
    raise ConfigError(
        f"the KV cache gets {budget / GiB:.2f} GiB once the weights are loaded and the workspace is kept free, "
        f"and needs {need / GiB:.2f} GiB for one {sched.max_model_len:,}-token request and {sched.max_num_seqs} "
        f"sliding windows: {(need - budget) / GiB:.2f} GiB short; try a smaller --max-model-len or "
        f"--max-num-seqs, or a higher --gpu-memory-utilization", "gpu_memory_utilization")


def capacity(plan: KVPlan, max_model_len: int) -> str:
    """What the KV cache holds, as context x concurrency: its full-attention tokens, and how many
    requests of max_model_len tokens (and of 8k and 4k, where shorter) fit at once."""
    tokens = plan.max_tokens_per_request()
    shorter = [f"{tokens // n} of {n:,}" for n in (8192, 4096) if n < max_model_len]
    more = f" ({', '.join(shorter)})" if shorter else ""
    return (f"KV cache: {tokens:,} tokens of context, enough for {tokens // max_model_len} requests of "
            f"{max_model_len:,} tokens at once{more}")


def plan_for_card(cfg: ModelConfig, cache: CacheConfig, sched: SchedulerConfig, dtype: torch.dtype,
                  device: DeviceMemory, kv_dtype: torch.dtype | None = None) -> tuple[int, KVPlan]:
    """(resident weights, KV plan) on a card of device.total bytes, as load.py would make them: the
    budget read after the weights are resident (with device.in_use already taken before). dtype:
    the weights'; kv_dtype: the cache's (default the same; FP8 holds 1.94x the tokens)."""
    weights = resident_weights(cfg, dtype, device.total)
    budget = kv_budget(device, device.in_use + weights, cache.gpu_memory_utilization,
                       workspace_bytes(sched.max_num_batched_tokens))
    return weights, plan_kv_cache(cfg, cache, sched, budget, kv_dtype or dtype, share_dtype=dtype)
