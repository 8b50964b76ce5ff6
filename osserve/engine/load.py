"""Assembling an engine from user-facing settings: load the model, size and allocate the KV cache,
and print the memory plan. The one place that turns flags into components."""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from osserve.config import CacheConfig, ModelConfig, SchedulerConfig, default_min_decodes, preset
from osserve.distributed.layout import ParallelConfig, ShardLayout
from osserve.engine.compile_log import CompileLog
from osserve.engine.core import decode_first
from osserve.engine.core.kv_cache import KVCacheManager
from osserve.engine.engine import EngineParts, LLMEngine
from osserve.engine.memory import (
    SIMULATED_GPU_ENV,
    DeviceMemory,
    GiB,
    capacity,
    default_batched_tokens,
    keep_checkpoint_experts,
    kv_budget,
    refuse_if_too_small,
    refuse_small_kv_budget,
    simulated_gpu_bytes,
    workspace_bytes,
)
from osserve.engine.warm_up import warm_up
from osserve.engine.worker.kv_tensors import KVPlan, allocate_kv_caches, layer_groups, plan_kv_cache
from osserve.engine.worker.runner import ModelRunner
from osserve.errors import ConfigError
from osserve.model.checkpoint import fill_random_weights
from osserve.model.gpt_oss import GptOssForCausalLM, KVCache
from osserve.model.resolve import resolve_model
from osserve.model.weights import build_model, load_weights
from osserve.ops.attention.fp8_triton import MIN_CAPABILITY as FP8_MIN_CAPABILITY
from osserve.ops.attention.kv_format import FP8_DTYPE
from osserve.ops.moe import swapped
from osserve.ops.policy import KernelPolicy, detect, use_policy
from osserve.speculative.config import SpeculativeConfig, resolve_speculative
from osserve.speculative.setup import capture_speculative_graphs, draft_for, draft_kv_bytes, make_decoder
from osserve.tokenizer import load_tokenizer
from osserve.unsupported import refuse_unsupported

if TYPE_CHECKING:
    from osserve.distributed.collectives import RankGroup
    from osserve.speculative.decoder import SpeculativeDecoder

log = logging.getLogger("osserve")

DEFAULT_CPU_KV_GB = 1.0


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
    max_num_batched_tokens: int | None = None  # None: 8192, or 16384 where the memory allows (memory.py)
    decode_first_chunk: int | None = None  # None: SchedulerConfig's; 0 (or no_decode_first): off
    decode_first_min_decodes: int | None = None
    no_decode_first: bool = False
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
    no_async_prefill: bool = False  # steps with prompt tokens finish the step in flight first
    tensor_parallel_size: int = 1  # ranks (GPUs) the model is split over (osserve/distributed/)
    enable_expert_parallel: bool = False  # split the experts over the ranks, not their columns
    nccl_port: int | None = None  # the ranks' rendezvous port on 127.0.0.1; None: a free one
    distributed_backend: str | None = None  # None: NCCL on GPUs, gloo on the CPU (gloo on a GPU: tests)
    tp_one_device: bool = False  # every rank on the first GPU (tests of the sharded shapes on one GPU)
    # The KV cache's: "auto" (the model's dtype), "bfloat16", or "fp8" / "fp8_e4m3" (e4m3 with a scale per
    # token and kv head, ops/attention/kv_format.py); others are refused (osserve/unsupported.py).
    kv_cache_dtype: str = "auto"
    portable_kernels: bool = False  # the portable Triton kernels on any GPU (ops/policy.py)
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


def resolve_kv_dtype(name: str, dtype: torch.dtype) -> torch.dtype:
    """--kv-cache-dtype (one of unsupported.KV_CACHE_DTYPES) -> the cache's dtype; dtype: the model's."""
    name = name.lower()
    if name == "auto":
        return dtype
    return FP8_DTYPE if name.startswith("fp8") else torch.bfloat16


def build_engine(args: EngineArgs) -> LLMEngine:
    refuse_unsupported(args)
    spec = resolve_speculative(args)
    device = resolve_device(args.device)
    compiles = CompileLog.install() if device.type == "cuda" else None
    cfg, model_dir = model_source(args)
    parallel = parallel_config(args)
    if spec is not None and parallel.size > 1:
        raise ConfigError("speculative decoding with --tensor-parallel-size > 1 is not supported yet: the draft "
                          "and its verification run on one GPU", "speculative_config")
    if parallel.size == 1:
        rank = build_rank(args, cfg, model_dir, device, None, None, ModelRunner, spec)
    else:
        from osserve.distributed.parallel_runner import ParallelRunner, start_ranks

        # The workers build from the same flags, the model already resolved to a folder.
        ranks = start_ranks(replace(args, model=str(model_dir)) if model_dir else args, cfg, parallel, device)
        try:
            with ranks.busy():
                rank = build_rank(args, cfg, model_dir, ranks.group.device, ranks.layout, ranks.group,
                                  lambda model, kv, block_size, dev: ParallelRunner(model, kv, block_size, dev, ranks))
                ranks.pool.wait_ready()
        except BaseException:
            ranks.shutdown()
            raise
    plan, sched = rank.plan, rank.sched
    groups = [(g, cfg.sliding_window if g == "sliding" else None) for g in layer_groups(cfg)]
    kv = KVCacheManager(block_size=plan.block_size, num_blocks=plan.num_blocks, groups=groups,
                        enable_prefix_caching=rank.cache.enable_prefix_caching)
    engine = LLMEngine(EngineParts(cfg, rank.cache, sched, rank.runner, kv, load_tokenizer(), rank.decoder))
    if compiles is not None:
        warm_up(engine)
        compiles.serving = True
    return engine


def model_source(args: EngineArgs) -> tuple[ModelConfig, Path | None]:
    """The model's config and its checkpoint folder (None: --load-format dummy)."""
    if args.load_format == "dummy":
        if args.preset is None:
            raise ConfigError("--load-format dummy needs --preset tiny|20b|120b")
        return preset(args.preset), None
    model_dir = resolve_model(args.model, args.revision, args.download_dir).path if args.model \
        else builtin_model_dir()
    return ModelConfig.from_pretrained(model_dir), model_dir


def parallel_config(args: EngineArgs) -> ParallelConfig:
    return ParallelConfig(size=args.tensor_parallel_size, expert_parallel=args.enable_expert_parallel,
                          port=args.nccl_port, backend=args.distributed_backend, one_device=args.tp_one_device)


@dataclass
class RankParts:
    """One rank's share of an engine: its model and runner, and the KV plan every rank agreed on."""

    runner: ModelRunner
    plan: KVPlan
    sched: SchedulerConfig
    cache: CacheConfig
    decoder: SpeculativeDecoder | None = None  # rank 0's speculative decoding (one GPU only)


MakeRunner = Callable[[GptOssForCausalLM, list[KVCache], int, torch.device], ModelRunner]


def build_rank(args: EngineArgs, cfg: ModelConfig, model_dir: Path | None, device: torch.device,
               layout: ShardLayout | None, group: RankGroup | None, make_runner: MakeRunner,
               spec: SpeculativeConfig | None = None) -> RankParts:
    """Load the model (this rank's share of it, with `layout`), size and allocate its KV cache,
    and make its runner, with its CUDA graphs. With several ranks each one runs this at once (rank
    0 in build_engine, the others in distributed/worker.py): the collectives inside it (the KV
    plan's agreement, the graphs' warm-up and capture) meet in the same order on every rank."""
    dtype = resolve_dtype(args.dtype, device)
    kv_dtype = resolve_kv_dtype(args.kv_cache_dtype, dtype)
    rank0 = layout is None or layout.rank == 0
    # Which kernels run (ops/policy.py): decided once, here; the runner enters it around every call.
    policy = detect(device, forced=args.portable_kernels)
    if policy.refusal is not None:
        raise ConfigError(policy.refusal, "device")
    refuse_fp8_kv_where_unsupported(kv_dtype, policy, args.kv_cache_dtype)
    cache = cache_config(args)
    sched = scheduler_config(args, cfg, device, cache, dtype, layout.size if layout is not None else 1)
    gpu_budget = device.type == "cuda" and cache.kv_cache_gb is None and cache.num_blocks is None
    if gpu_budget and layout is None:  # before a byte is allocated: a model that cannot fit is refused in one line
        label = args.model or (f"gpt-oss-{args.preset} (dummy weights)" if model_dir is None else "the built-in model")
        refuse_if_too_small(label, cfg, cache, sched, dtype, device_memory(device), kv_dtype)
    model = build_model(cfg, device, dtype, layout)
    if model_dir is None:
        fill_random_weights(model, cfg, args.seed)
    else:
        load_weights(model, model_dir, show_progress=device.type == "cuda" and rank0)
    if group is not None:
        model.join(group)
    weights_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    if device.type == "cuda":
        total = device_memory(device).total
        # With the Hopper policy the Gluon kernel's weight layout (ops/moe/gluon.py); else the Triton kernels'.
        from osserve.ops.moe import gluon

        intermediate = layout.intermediate if layout is not None else cfg.intermediate_size
        with use_policy(policy):
            fragments = gluon.supported(device, cfg.hidden_size, intermediate)
            prepared = model.prepare_experts(keep_original=keep_checkpoint_experts(weights_bytes, total),
                                             fragments=fragments)
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

    # On the GPU, in use once the weights are resident: weights, CUDA context, the allocator's fragments.
    in_use = device_memory(device).in_use if device.type == "cuda" else weights_bytes
    draft = None
    if spec is not None:
        sched = replace(sched, speculative_slots=spec.max_drafts + spec.lookahead_slots)
        builtin = builtin_draft_dir() if args.model is None and args.load_format != "dummy" else None
        draft = draft_for(spec, model, device, dtype, args.load_format == "dummy", args.seed, builtin,
                          sched.max_model_len + sched.speculative_slots + 1)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    budget = kv_budget_bytes(cache, device, sched)
    local = layout.local_config(cfg) if layout is not None else cfg  # this rank's kv heads
    if gpu_budget:
        refuse_small_kv_budget(budget, local, cache, sched, kv_dtype)
    # The EAGLE3 draft's own cache stays in the model's dtype (speculative/setup.py).
    plan = plan_kv_cache(local, cache, sched, budget, kv_dtype, draft_kv_bytes(draft, cache.block_size, dtype),
                         share_dtype=dtype)
    if group is not None:  # one scheduler hands out blocks for every rank: the smallest pool
        names = list(plan.num_blocks)
        plan = replace(plan, num_blocks=dict(zip(names, group.min_over_ranks([plan.num_blocks[g] for g in names]),
                                                 strict=True)))
    kv_tensors = allocate_kv_caches(local, plan, kv_dtype, device)
    runner = make_runner(model, kv_tensors, plan.block_size, device)
    runner.policy = policy  # the kernels this engine was planned for (the flag, the device)
    decoder = None if spec is None else make_decoder(spec, cfg, draft, plan, runner, dtype, sched.max_model_len)
    graphs_bytes = 0
    # gloo's collectives (tests on one GPU) cannot be captured: those steps run eagerly.
    if device.type == "cuda" and not args.enforce_eager and (group is None or group.backend == "nccl"):
        before = torch.cuda.memory_reserved(device)
        largest = min(sched.max_num_seqs, args.max_cudagraph_capture_size or sched.max_num_seqs)
        runner.capture_decode_graphs(list(plan.num_blocks), sched.max_model_len, largest,
                                     mixed=not args.no_mixed_graphs)
        if decoder is not None:
            capture_speculative_graphs(decoder, runner, list(plan.num_blocks),
                                       sched.max_model_len + sched.speculative_slots + 1,
                                       min(largest, decoder.config.disable_by_batch_size), dtype)
        graphs_bytes = torch.cuda.memory_reserved(device) - before
    log.info(
        "memory plan%s: weights %.2f GiB (%.2f GiB in use after loading), KV cache %.2f GiB (%s blocks of %d "
        "tokens: %d full-attention tokens, %s), CUDA graphs + activations %.2f GiB, workspace kept free %.2f GiB; "
        "dtype %s, %s; %s",
        f" of rank {layout.rank} of {layout.size}" if layout is not None else "",
        weights_bytes / GiB, in_use / GiB, plan.total_bytes / GiB, plan.num_blocks, plan.block_size,
        plan.max_tokens_per_request(), kv_description(kv_dtype), graphs_bytes / GiB,
        workspace_bytes(sched.max_num_batched_tokens) / GiB if device.type == "cuda" else 0.0, dtype, device,
        policy.describe(),
    )
    if rank0:
        log.info("%s", capacity(plan, sched.max_model_len))
        log.info("scheduler: %s", decode_first.describe(sched.decode_first_chunk, sched.decode_first_min_decodes,
                                                        sched.max_num_batched_tokens))
    if spec is not None:
        log.info("speculative decoding: %s, %d draft steps, top-%d, %d tokens verified a step, off above %d "
                 "requests", spec.method, spec.num_speculative_tokens, spec.topk, spec.num_draft_tokens,
                 spec.disable_by_batch_size)
    return RankParts(runner, plan, sched, cache, decoder)


def refuse_fp8_kv_where_unsupported(kv_dtype: torch.dtype, policy: KernelPolicy, flag: str) -> None:
    """ConfigError where an FP8 cache cannot run: the kernels' e4m3 conversions need an NVIDIA GPU of
    compute capability 8.9 or later (ops/attention/fp8_triton.py); the CPU's reference path takes it."""
    if kv_dtype != FP8_DTYPE or policy.capability is None:
        return
    if torch.version.hip is not None or policy.capability < FP8_MIN_CAPABILITY:
        sm = "sm_{}{}".format(*policy.capability)
        raise ConfigError(f"--kv-cache-dtype {flag} needs an NVIDIA GPU of compute capability 8.9 or later (L4, "
                          f"L40S, RTX 40xx, H100, H200, B200) for its e4m3 conversions; this one is {sm}: use "
                          f"--kv-cache-dtype auto", "kv_cache_dtype")


def kv_description(kv_dtype: torch.dtype) -> str:
    if kv_dtype == FP8_DTYPE:
        return "fp8 e4m3, a scale per token and kv head"
    return str(kv_dtype).removeprefix("torch.")


def scheduler_config(args: EngineArgs, cfg: ModelConfig, device: torch.device, cache: CacheConfig,
                     dtype: torch.dtype, ranks: int = 1) -> SchedulerConfig:
    defaults = SchedulerConfig()
    budget = args.max_num_batched_tokens or defaults.max_num_batched_tokens
    if not args.max_num_batched_tokens and device.type == "cuda":
        budget = default_batched_tokens(cfg, cache, dtype, device_memory(device).total, ranks)
    chunk = defaults.decode_first_chunk if args.decode_first_chunk is None else args.decode_first_chunk
    # A CPU runs the tiny model: a smaller running set keeps each step's latency low.
    max_num_seqs = args.max_num_seqs or (defaults.max_num_seqs if device.type == "cuda" else 32)
    min_decodes = args.decode_first_min_decodes
    if min_decodes is None:
        min_decodes = default_min_decodes(max_num_seqs, budget)
    return SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=args.max_model_len or min(cfg.max_position_embeddings, 8192 if device.type == "cpu" else 32768),
        admission_delay_s=args.admission_delay_ms / 1000,
        async_scheduling=not args.no_async_scheduling,
        async_prefill=not args.no_async_prefill,
        decode_first_chunk=0 if args.no_decode_first else chunk,
        decode_first_min_decodes=min_decodes,
    )


def cache_config(args: EngineArgs) -> CacheConfig:
    return CacheConfig(block_size=args.block_size, num_blocks=args.num_blocks, kv_cache_gb=args.kv_cache_gb,
                       gpu_memory_utilization=args.gpu_memory_utilization,
                       enable_prefix_caching=not args.no_prefix_caching)


def device_memory(device: torch.device) -> DeviceMemory:
    """The card's size and what is in use on it now (this process's CUDA context, other processes);
    with OSSERVE_GPU_MEMORY_GB (engine/memory.py) a smaller card's size, the allocator held to it."""
    free, total = torch.cuda.mem_get_info(device)
    name, in_use = torch.cuda.get_device_name(device), total - free
    simulated = simulated_gpu_bytes()
    if simulated is None:
        return DeviceMemory(name, total, in_use)
    if simulated > total:
        raise ConfigError(f"{SIMULATED_GPU_ENV}: {simulated / GiB:.2f} GiB is more than the {total / GiB:.2f} GiB "
                          f"of {name}", "device")
    torch.cuda.set_per_process_memory_fraction(simulated / total, device)
    return DeviceMemory(f"{name} held to {simulated / GiB:.2f} GiB", simulated, in_use)


def kv_budget_bytes(cache: CacheConfig, device: torch.device, sched: SchedulerConfig) -> int:
    """CPU: --kv-cache-gb; CUDA: the free memory left under --gpu-memory-utilization, less the
    workspace (engine/memory.py)."""
    if cache.kv_cache_gb is not None:
        return int(cache.kv_cache_gb * GiB)
    if device.type != "cuda":
        return int(DEFAULT_CPU_KV_GB * GiB)
    now = device_memory(device)
    return kv_budget(now, now.in_use, cache.gpu_memory_utilization, workspace_bytes(sched.max_num_batched_tokens))
