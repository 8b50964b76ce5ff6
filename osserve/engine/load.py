"""Assembling an engine from user-facing settings: load the model, size and allocate the KV cache,
and print the memory plan. The one place that turns flags into components."""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch

from osserve.config import CacheConfig, ModelConfig, SchedulerConfig, preset
from osserve.engine.core.kv_cache import KVCacheManager
from osserve.engine.engine import EngineParts, LLMEngine
from osserve.engine.worker.kv_tensors import allocate_kv_caches, layer_groups, plan_kv_cache
from osserve.engine.worker.runner import ModelRunner
from osserve.errors import ConfigError
from osserve.model.checkpoint import fill_random_weights
from osserve.model.resolve import resolve_model
from osserve.model.weights import build_model, load_weights
from osserve.ops.moe import swapped
from osserve.speculative.config import resolve_speculative
from osserve.speculative.setup import capture_speculative_graphs, draft_for, draft_kv_bytes, make_decoder
from osserve.tokenizer import load_tokenizer
from osserve.unsupported import refuse_unsupported

log = logging.getLogger("osserve")

DEFAULT_CPU_KV_GB = 1.0
# Kept free on the GPU for the largest step's activations and the CUDA graphs' pool: at
# max_num_batched_tokens 8192 the MoE's fp32 partial sums are 8192x4x2880x4 B = 0.38 GB, and
# logits are computed only for sampled rows (at most max_num_seqs x 201088 x 4 B = 0.2 GB).
WORKSPACE_BYTES = 3 * 2**30


@dataclass
class EngineArgs:
    model: str | None = None  # a folder or a Hugging Face id (model/resolve.py); None: the built-in model
    revision: str | None = None  # of a Hugging Face id
    download_dir: str | None = None  # the Hugging Face cache to use
    load_format: str = "auto"  # "dummy": random weights of `preset`'s shapes, made on the device
    preset: str | None = None
    device: str | None = None
    dtype: str = "auto"
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    admission_delay_ms: float = 0.0
    gpu_memory_utilization: float = 0.90
    kv_cache_gb: float | None = None
    num_blocks: int | None = None  # tests: force a tiny pool
    block_size: int = 16
    no_prefix_caching: bool = False
    enforce_eager: bool = False
    max_cudagraph_capture_size: int | None = None  # None: up to max_num_seqs
    no_mixed_graphs: bool = False  # mixed prefill+decode steps run eagerly (A/B, debugging)
    no_async_scheduling: bool = False
    # Parsed, refused when not 1 / None / "auto" until built (osserve/unsupported.py).
    tensor_parallel_size: int = 1
    kv_cache_dtype: str = "auto"
    # speculative/config.py: vLLM's JSON (a dict from LLM(...)), or SGLang's flags
    speculative_config: str | dict[str, Any] | None = None
    speculative_algorithm: str | None = None
    speculative_draft_model_path: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    seed: int = 0

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> EngineArgs:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in vars(ns).items() if k in names})


def builtin_model_dir() -> Path:
    """The built-in model: the trained demo model shipped in compact form (osserve/demo/), expanded
    once into the Hugging Face layout in the cache folder (a second or two), then reused. The
    folder's name carries the compact file's hash, so a new demo model is expanded afresh."""
    from osserve.demo.compact import expand_compact
    from osserve.demo.weights import DEMO_WEIGHTS

    digest = hashlib.sha256(DEMO_WEIGHTS.read_bytes()).hexdigest()[:12]
    cache = Path(os.environ.get("OSSERVE_CACHE_DIR", Path.home() / ".cache" / "osserve"))
    target = cache / "models" / f"demo-{digest}"
    if not (target / "model.safetensors").is_file():
        log.info("expanding the built-in demo model into %s", target)
        expand_compact(DEMO_WEIGHTS, target)
    return target


def builtin_draft_dir() -> Path | None:
    """The built-in model's EAGLE3 draft (osserve/demo/), expanded once into the cache folder like
    the model; None where this build ships none."""
    from osserve.demo.weights import DEMO_DRAFT

    if not DEMO_DRAFT.is_file():
        return None
    from osserve.demo.draft_compact import expand_draft

    digest = hashlib.sha256(DEMO_DRAFT.read_bytes()).hexdigest()[:12]
    cache = Path(os.environ.get("OSSERVE_CACHE_DIR", Path.home() / ".cache" / "osserve"))
    target = cache / "models" / f"demo-draft-{digest}"
    if not (target / "model.safetensors").is_file():
        expand_draft(DEMO_DRAFT, target)
    return target


def resolve_device(name: str | None) -> torch.device:
    if name:
        return torch.device(name)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"bfloat16": torch.bfloat16, "float32": torch.float32}[name]


def build_engine(args: EngineArgs) -> LLMEngine:
    refuse_unsupported(args)
    spec = resolve_speculative(args)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    if args.load_format == "dummy":
        if args.preset is None:
            raise ConfigError("--load-format dummy needs --preset tiny|20b|120b")
        cfg = preset(args.preset)
        model = build_model(cfg, device, dtype)
        fill_random_weights(model, cfg, args.seed)
    else:
        model_dir = resolve_model(args.model, args.revision, args.download_dir).path if args.model \
            else builtin_model_dir()
        cfg = ModelConfig.from_pretrained(model_dir)
        model = build_model(cfg, device, dtype)
        load_weights(model, model_dir, show_progress=device.type == "cuda")
    weights_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    if device.type == "cuda":
        # Keep the checkpoint-layout experts beside the kernel's layout (for the dense prefill
        # path) only when both fit comfortably: the 20b yes, the 120b on one 80 GB GPU no.
        total = torch.cuda.get_device_properties(device).total_memory
        # On Hopper the Gluon kernel's weight layout (ops/moe/gluon.py); elsewhere the Triton kernels'.
        from osserve.ops.moe import gluon

        fragments = gluon.supported(device, cfg.hidden_size, cfg.intermediate_size)
        prepared = model.prepare_experts(keep_original=2 * weights_bytes < 0.6 * total, fragments=fragments)
        compile_moe = gluon.compile_kernels if fragments else swapped.compile_kernels
        compile_moe(prepared[0], cfg.num_experts_per_tok, cfg.swiglu_limit, dtype)
        # Hand the freed checkpoint-layout tensors and load temporaries back to the driver, so the
        # KV budget below (read from the driver's free memory) sees them as free.
        torch.cuda.empty_cache()
    # After the experts' re-layout, then the freed q/k/v tensors back to the driver. Fused before
    # the re-layout, they stayed with the allocator: the 120b's KV plan at 0.97 fell from 151k to
    # 110k tokens (6.92 -> 5.48 GiB).
    model.fuse_qkv()
    if device.type == "cuda":
        torch.cuda.empty_cache()

    max_model_len = args.max_model_len or min(cfg.max_position_embeddings, 8192 if device.type == "cpu" else 32768)
    defaults = SchedulerConfig()
    sched = SchedulerConfig(
        # A CPU runs the tiny model: a smaller running set keeps each step's latency low.
        max_num_seqs=args.max_num_seqs or (defaults.max_num_seqs if device.type == "cuda" else 32),
        max_num_batched_tokens=args.max_num_batched_tokens or defaults.max_num_batched_tokens,
        max_model_len=max_model_len,
        admission_delay_s=args.admission_delay_ms / 1000,
        async_scheduling=not args.no_async_scheduling,
    )
    cache = CacheConfig(block_size=args.block_size, num_blocks=args.num_blocks,
                        kv_cache_gb=args.kv_cache_gb,
                        gpu_memory_utilization=args.gpu_memory_utilization,
                        enable_prefix_caching=not args.no_prefix_caching)
    draft = None
    if spec is not None:
        sched = replace(sched, speculative_slots=spec.max_drafts + spec.lookahead_slots)
        builtin = builtin_draft_dir() if args.model is None and args.load_format != "dummy" else None
        draft = draft_for(spec, model, device, dtype, args.load_format == "dummy", args.seed, builtin,
                          max_model_len + sched.speculative_slots + 1)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    budget = kv_budget_bytes(cache, device)
    plan = plan_kv_cache(cfg, cache, sched, budget, dtype, draft_kv_bytes(draft, cache.block_size, dtype))
    kv_tensors = allocate_kv_caches(cfg, plan, dtype, device)
    groups = [(g, cfg.sliding_window if g == "sliding" else None) for g in layer_groups(cfg)]
    kv = KVCacheManager(block_size=plan.block_size, num_blocks=plan.num_blocks, groups=groups,
                        enable_prefix_caching=cache.enable_prefix_caching)
    runner = ModelRunner(model, kv_tensors, plan.block_size, device)
    decoder = None if spec is None else make_decoder(spec, cfg, draft, plan, runner, dtype, max_model_len)
    graphs_bytes = 0
    if device.type == "cuda" and not args.enforce_eager:
        before = torch.cuda.memory_reserved(device)
        largest = min(sched.max_num_seqs, args.max_cudagraph_capture_size or sched.max_num_seqs)
        runner.capture_decode_graphs(list(plan.num_blocks), max_model_len, largest,
                                     mixed=not args.no_mixed_graphs)
        if decoder is not None:
            capture_speculative_graphs(decoder, runner, list(plan.num_blocks), max_model_len + sched.speculative_slots
                                       + 1, min(largest, decoder.config.disable_by_batch_size), dtype)
        graphs_bytes = torch.cuda.memory_reserved(device) - before
    log.info(
        "memory plan: weights %.2f GiB, KV cache %.2f GiB (%s blocks of %d tokens: %d full-attention "
        "tokens), CUDA graphs + activations %.2f GiB, workspace kept free %.2f GiB; dtype %s, %s",
        weights_bytes / 2**30, plan.total_bytes / 2**30, plan.num_blocks, plan.block_size,
        plan.max_tokens_per_request(), graphs_bytes / 2**30, WORKSPACE_BYTES / 2**30 if device.type == "cuda"
        else 0.0, dtype, device,
    )
    if spec is not None:
        log.info("speculative decoding: %s, %d draft steps, top-%d, %d tokens verified a step, off above %d "
                 "requests", spec.method, spec.num_speculative_tokens, spec.topk, spec.num_draft_tokens,
                 spec.disable_by_batch_size)
    engine = LLMEngine(EngineParts(cfg, cache, sched, runner, kv, load_tokenizer(), decoder))
    if device.type == "cuda":
        engine.warm_up()
    return engine


def kv_budget_bytes(cache: CacheConfig, device: torch.device) -> int:
    """CPU: --kv-cache-gb; CUDA: the free memory left under --gpu-memory-utilization."""
    if cache.kv_cache_gb is not None:
        return int(cache.kv_cache_gb * 2**30)
    if device.type != "cuda":
        return int(DEFAULT_CPU_KV_GB * 2**30)
    free, total = torch.cuda.mem_get_info(device)
    used = total - free
    return max(0, int(total * cache.gpu_memory_utilization) - used - WORKSPACE_BYTES)
