"""A decode step's logits and their greedy choice: the logits projection with argmax partials.

At batch 1 the logits projection (lm_head [201088, 2880] bf16, 1.16 GB) is a fifth of a 20b
step, streamed by the small-M linear kernel at ~3 TB/s. Around it the step launched two more
kernels: the cast of the bf16 logits to float32 for the sampler, and torch's argmax over 201,088
of them. Here the projection's epilogue does both of their jobs:
- it stores the logits as float32, rounded through x's dtype first: the values of
  `F.linear(x, W).float()` up to the order of the fp32 sums (bit for bit those of the small-M
  linear when run with its config; one token runs its own, ONE_TOKEN_CONFIG);
- each program also stores, per token, the largest of its BLOCK_N logits and the first row that
  holds it. A second launch (one program per token) picks the best of those partials, the first
  among equals: torch.argmax's index.
The second launch can also write the ids straight into pinned host memory (HostIds), where the
engine reads them once the step is done: no copy to the host after the step.
NaN logits give torch.argmax's answer, the first NaN: a model that produced them still yields an
id inside the vocabulary (the next decode graph's embedding gather reads it on the device).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from osserve.ops.linear.small_m_triton import (
    DEFAULT_CONFIG,
    LinearConfig,
    fits_small_m_linear,
    prefetch_lines,
    small_m_block,
    stages_that_fit,
)
from osserve.ops.pdl import pdl_enter, pdl_launch
from osserve.ops.policy import kernel_policy

NO_ROW = tl.constexpr(2**31 - 1)  # larger than any row index: loses every "first row" minimum
# One token: the fastest of a sweep (benchmarks/bench_head.py, H100), 391.5 µs against 399.1 for the
# small-M linear's own config (64 rows, 128 columns a step, 4 warps, 5 stages); in the engine the 20b
# batch-1 median TPOT went 1.860 -> 1.846 ms. At 32 tokens it was slower (426.2 against 423.4 µs), so
# more tokens keep the linear's config.
ONE_TOKEN_CONFIG = LinearConfig(block_n=32, block_k=256, num_warps=4, num_stages=6)


@dataclass(frozen=True)
class HostIds:
    """Where the greedy ids also go: row slot[0] of `ring`, pinned host memory that the kernel writes
    over the bus (a CUDA graph captures the addresses; the step picks the row)."""

    ring: torch.Tensor  # [rows, >= M] int64, pinned (any CPU tensor under the interpreter)
    slot: torch.Tensor  # [1] int32, on the kernel's device


def head_config(num_tokens: int) -> LinearConfig:
    return ONE_TOKEN_CONFIG if num_tokens == 1 else DEFAULT_CONFIG


@triton.jit
def _logits_kernel(
    x_ptr, w_ptr, out_ptr, best_val_ptr, best_row_ptr, M, N, K, stride_xm, stride_wn, num_blocks,
    EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr, DOT_PRECISION: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr,
):  # noqa: ANN001
    pid = tl.program_id(0)
    acc, rn, rm, n_ok, m_ok = small_m_block(x_ptr, w_ptr, pid, M, N, 0, K, stride_xm, stride_wn, BLOCK_N, BLOCK_M,
                                            BLOCK_K, EVEN_K, NUM_STAGES, DOT_PRECISION, PDL, PREFETCH)
    # F.linear's output is rounded to x's dtype; the sampler then reads it as float32.
    logits = acc.to(x_ptr.dtype.element_ty).to(tl.float32)  # [BLOCK_N, BLOCK_M]
    ok = n_ok[:, None] & m_ok[None, :]
    tl.store(out_ptr + rm.to(tl.int64)[None, :] * N + rn[:, None], logits, mask=ok)
    vals = tl.where(ok, logits, float("-inf"))
    best = tl.max(vals, axis=0)  # [BLOCK_M]
    first = tl.min(tl.where(vals == best[None, :], rn[:, None], NO_ROW), axis=0)
    # torch.argmax takes a NaN as the largest value: the block's first NaN, if any, stands as its best.
    first_nan = tl.min(tl.where(vals != vals, rn[:, None], NO_ROW), axis=0)
    best = tl.where(first_nan < NO_ROW, float("nan"), best)
    first = tl.where(first_nan < NO_ROW, first_nan, first)
    tl.store(best_val_ptr + rm * num_blocks + pid, best, mask=m_ok)
    tl.store(best_row_ptr + rm * num_blocks + pid, first, mask=m_ok)


@triton.jit
def _argmax_partials_kernel(best_val_ptr, best_row_ptr, out_ptr, num_blocks, host_ptr, slot_ptr, host_stride,
                            BLOCK: tl.constexpr, TO_HOST: tl.constexpr, PDL: tl.constexpr):  # noqa: ANN001
    row = tl.program_id(0)
    pdl_enter(PDL)
    b = tl.arange(0, BLOCK)
    ok = b < num_blocks
    vals = tl.load(best_val_ptr + row * num_blocks + b, mask=ok, other=float("-inf"))
    rows = tl.load(best_row_ptr + row * num_blocks + b, mask=ok, other=NO_ROW)
    best = tl.max(vals, axis=0)
    # Blocks are in row order, so the smallest row among the best blocks is the first overall;
    # a block's best is NaN where it holds one, and then the first such block's row wins.
    chosen = tl.min(tl.where(ok & (vals == best), rows, NO_ROW), axis=0)
    first_nan = tl.min(tl.where(ok & (vals != vals), rows, NO_ROW), axis=0)
    chosen = tl.where(first_nan < NO_ROW, first_nan, chosen).to(tl.int64)
    tl.store(out_ptr + row, chosen)
    if TO_HOST:
        tl.store(host_ptr + tl.load(slot_ptr).to(tl.int64) * host_stride + row, chosen)


def fits_logits_triton(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return fits_small_m_linear(x, weight) and weight.shape[0] < NO_ROW.value


def logits_and_greedy_triton(
    x: torch.Tensor,  # [M, K], M <= linear_triton.MAX_TOKENS
    weight: torch.Tensor,  # [N, K] (lm_head)
    config: LinearConfig | None = None,  # None: head_config(M)
    greedy_out: torch.Tensor | None = None,  # [M] int64 to write the ids into (None: a new tensor)
    host_out: HostIds | None = None,  # pinned host memory the ids also go to
) -> tuple[torch.Tensor, torch.Tensor]:
    """(F.linear(x, weight).float() [M, N], its argmax over N [M] int64) in two launches."""
    assert fits_logits_triton(x, weight), (x.shape, x.stride(), weight.shape, x.dtype, weight.dtype)
    m, k = x.shape
    config = config or head_config(m)
    n = weight.shape[0]
    assert weight.shape[1] == k
    num_blocks = triton.cdiv(n, config.block_n)
    logits = torch.empty(m, n, dtype=torch.float32, device=x.device)
    best_val = torch.empty(m, num_blocks, dtype=torch.float32, device=x.device)
    best_row = torch.empty(m, num_blocks, dtype=torch.int32, device=x.device)
    greedy = torch.empty(m, dtype=torch.int64, device=x.device) if greedy_out is None else greedy_out
    assert greedy.shape == (m,) and greedy.dtype == torch.int64 and greedy.is_contiguous()
    block_m = max(16, triton.next_power_of_2(m))
    pdl = pdl_launch(x.device)
    _logits_kernel[(num_blocks,)](
        x, weight, logits, best_val, best_row, m, n, k, x.stride(0), weight.stride(0), num_blocks,
        EVEN_K=k % config.block_k == 0, BLOCK_N=config.block_n, BLOCK_M=block_m, BLOCK_K=config.block_k,
        NUM_STAGES=stages_that_fit(config, block_m, x.element_size(), kernel_policy(x.device).shared_memory),
        # fp32 (CPU tests): no silent TF32; bf16 ignores the setting.
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", PDL=pdl,
        PREFETCH=prefetch_lines(num_blocks, x.device), num_warps=config.num_warps, launch_pdl=pdl,
    )
    if host_out is not None:
        ring, slot = host_out.ring, host_out.slot
        assert ring.dtype == torch.int64 and ring.shape[1] >= m and ring.stride(1) == 1 and slot.dtype == torch.int32
    else:
        ring, slot = greedy, best_row  # unused
    _argmax_partials_kernel[(m,)](best_val, best_row, greedy, num_blocks, ring, slot, ring.stride(0),
                                  BLOCK=triton.next_power_of_2(num_blocks), TO_HOST=host_out is not None,
                                  PDL=pdl, num_warps=4, launch_pdl=pdl)
    return logits, greedy
