"""Which part of the model each of N ranks holds, and the start-up checks that N fits the model.

Attention is split by heads: rank r holds query heads [r·H/N, (r+1)·H/N) and the key/value heads
they read (GQA: H/K query heads share one), so q, k and v are column-parallel and o row-parallel,
one all-reduce after it. Up to K ranks (gpt-oss: 8) each hold K/N whole kv heads; above, each kv
head is held by N/K ranks (vLLM's rule), which the tiny test model (one kv head) needs at any N.

The experts are split one of two ways:
- tensor parallel (the default): every rank holds every expert, and a slice of each expert's
  intermediate dimension (gate_up's rows column-parallel, down's columns row-parallel), one
  all-reduce after the MoE. MXFP4 stores down's columns in blocks of 32 that share a scale, so
  the slices are cut at whole blocks; gpt-oss's 2880 = 90 blocks split unevenly over 4 or 8 ranks
  (22/23 and 11/12 blocks), and each rank's slice is zero-padded up to the widest, rounded up to
  the fused MoE kernels' K step of 64 columns: 1472 columns at N=2 (1440 real), 768 at N=4
  (720 on average), 384 at N=8 (360). Zero weights and zero biases make a padded column's SwiGLU
  exactly 0, so the padding changes no result; it costs 2.2% (N=2) or 6.7% (N=4, 8) more expert
  bytes read than an exact split would. vLLM pads the same way.
- expert parallel (`--enable-expert-parallel`): rank r holds experts [r·E/N, (r+1)·E/N) whole,
  nothing padded; the router stays replicated, each rank runs its own experts' share of every
  token (expert_routing.py) and the same one all-reduce sums them. N must divide E.

The embedding, the norms, the router and the lm_head are replicated (the sinks go with their
heads): every rank has the whole hidden state after each all-reduce, and rank 0 alone computes
the logits, for the sampler beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from osserve.config import ModelConfig
from osserve.errors import ConfigError

MXFP4_BLOCK = 32  # values that share one scale along the input dimension
# The fused MoE kernels step through the intermediate dimension 64 columns at a time (the Gluon
# kernel requires it, ops/moe/gluon.py's `supported`; the Triton kernels take any multiple of 32).
MOE_COLUMN_STEP = 64


@dataclass(frozen=True)
class ParallelConfig:
    """How one model spans several ranks (engine/load.py builds it from the flags)."""

    size: int = 1  # --tensor-parallel-size
    expert_parallel: bool = False  # --enable-expert-parallel
    port: int | None = None  # the rendezvous's TCP port on 127.0.0.1 (--nccl-port); None: a free one
    backend: str | None = None  # None: NCCL on GPUs, gloo on the CPU; "gloo" on GPUs: correctness tests
    one_device: bool = False  # every rank on the first GPU (tests on one GPU, with gloo)


@dataclass(frozen=True)
class ShardLayout:
    """What rank `rank` of `size` holds, in the checkpoint's (global) numbering."""

    rank: int
    size: int
    expert_parallel: bool
    q_heads: range
    kv_heads: range
    experts: range
    columns: range  # the intermediate columns (expert FFN units) of the checkpoint this rank holds
    intermediate: int  # its experts' intermediate size: len(columns), zero-padded (module docstring)

    @classmethod
    def of(cls, cfg: ModelConfig, rank: int, size: int, expert_parallel: bool) -> ShardLayout:
        check_parallel_fits(cfg, size, expert_parallel)
        nq, nkv, ne = cfg.num_attention_heads // size, cfg.num_key_value_heads, cfg.num_local_experts
        q_heads = range(rank * nq, (rank + 1) * nq)
        if size <= nkv:
            kv_heads = range(rank * nkv // size, (rank + 1) * nkv // size)
        else:  # several ranks read each kv head: rank r's query heads all read head r // (N / K)
            first = rank // (size // nkv)
            kv_heads = range(first, first + 1)
        if expert_parallel:
            return cls(rank, size, True, q_heads, kv_heads, range(rank * ne // size, (rank + 1) * ne // size),
                       range(cfg.intermediate_size), cfg.intermediate_size)
        blocks = cfg.intermediate_size // MXFP4_BLOCK
        first_block, end_block = rank * blocks // size, (rank + 1) * blocks // size
        widest = -(-blocks // size) * MXFP4_BLOCK
        return cls(rank, size, False, q_heads, kv_heads, range(ne),
                   range(first_block * MXFP4_BLOCK, end_block * MXFP4_BLOCK),
                   -(-widest // MOE_COLUMN_STEP) * MOE_COLUMN_STEP)

    def local_config(self, cfg: ModelConfig) -> ModelConfig:
        """The model's config with this rank's head counts: what its attention and KV cache see."""
        return replace(cfg, num_attention_heads=len(self.q_heads), num_key_value_heads=len(self.kv_heads))


def check_parallel_fits(cfg: ModelConfig, size: int, expert_parallel: bool) -> None:
    """ConfigError, naming the flag, where N ranks cannot split this model."""
    flag = f"--tensor-parallel-size {size}"
    if size < 1:
        raise ConfigError(f"{flag}: the size must be at least 1", "tensor_parallel_size")
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    if heads % size:
        raise ConfigError(f"{flag} must divide the model's {heads} attention heads (try 1, 2, 4 or 8)",
                          "tensor_parallel_size")
    if kv % size and size % kv:
        raise ConfigError(f"{flag} must divide the model's {kv} key/value heads or be a multiple of them",
                          "tensor_parallel_size")
    experts, blocks = cfg.num_local_experts, cfg.intermediate_size // MXFP4_BLOCK
    if expert_parallel and experts % size:
        raise ConfigError(f"--enable-expert-parallel: {flag} must divide the model's {experts} experts",
                          "tensor_parallel_size")
    if not expert_parallel and blocks < size:
        raise ConfigError(f"{flag}: the experts' intermediate size {cfg.intermediate_size} is only {blocks} "
                          f"MXFP4 blocks, fewer than the ranks; use --enable-expert-parallel", "tensor_parallel_size")
