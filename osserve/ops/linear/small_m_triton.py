"""Small-batch linear layer: out[M, N] = x[M, K] · W[N, K]ᵀ + b, for M <= MAX_TOKENS (decode).

At decode a projection reads its whole weight for a handful of rows: a matrix-vector product
bound by memory bandwidth. On the H100 (benchmarks/bench_linear.py) cuBLAS took 14.5 µs for the
o projection's 23.6 MB at batch 1 (1.6 TB/s) and 420 µs for lm_head's 1.16 GB; this kernel 12.4
µs, and 394 µs for lm_head (that one measured with BLOCK_N 16, BLOCK_K 256). Most of the decode
projections' gain came from fusing q, k and v into one GEMM (model/gpt_oss.py): 26.4 -> 13.7 µs
per layer with cuBLAS alone.

Each program owns BLOCK_N weight rows and the whole K, streamed through a pipelined loop. The
product is computed "swapped": acc[BLOCK_N, BLOCK_M] = W_tile · x_tileᵀ, the weight rows as the
MMA's M dimension, the few tokens as its N (masked past M): no weight tile is loaded twice, and
the x tile is a few KB that stay in L1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from osserve.ops.pdl import pdl_enter, pdl_launch, prefetch_before_wait, prefetch_rows
from osserve.ops.policy import kernel_policy

# Above this cuBLAS's tiled GEMMs win (H100, benchmarks/bench_linear.py: at 64 rows the x tile
# crowds the pipeline's shared memory and the kernel fell to 1.2 TB/s).
MAX_TOKENS = 32


@dataclass(frozen=True)
class LinearConfig:
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


# The best all-round config of the H100 sweep (bench_linear.py --sweep, 2026-11-23): within 0.7 µs
# of each shape's best at 1 and 32 rows for the fused qkv [5120, 2880] and o [2880, 4096] weights.
DEFAULT_CONFIG = LinearConfig(block_n=64, block_k=128, num_warps=4, num_stages=5)
# Shared memory kept beside the pipelined tiles (the kernels' epilogues reuse the tiles' buffers:
# tests/ops/test_compile_targets.py reads the compiled kernels' use for sm_80, sm_86 and sm_89).
SHARED_MEMORY_RESERVE = 8192
# With PDL (ops/pdl.py) a program asks L2 for the first lines of its weight rows before it waits
# for the kernel before it: 8 lines of 128 bytes, the first 4 K steps of a bf16 row. Only where the
# grid is at most PREFETCH_WAVES programs per SM: the programs of later waves start after the wait.
PREFETCH_LINES = 8
PREFETCH_WAVES = 2


def prefetch_lines(programs: int, device: torch.device) -> int:
    """PREFETCH_LINES where a grid of `programs` is placed at once (before its predecessor ends) and
    prefetching is on (ops/pdl.py), else 0."""
    if not prefetch_before_wait(device):
        return 0
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return PREFETCH_LINES if programs <= PREFETCH_WAVES * sms else 0


def stages_that_fit(config: LinearConfig, block_m: int, itemsize: int, shared_memory: int) -> int:
    """config.num_stages, fewer where the W and x tiles would overflow `shared_memory` (bytes a block
    may use: the kernel policy's, ops/policy.py). Triton's pipeliner keeps num_stages - 1 tiles in
    flight: 5 stages of the default config at 16 rows take 80 KB, which fits an H100's 227 KB and an
    A10's 99 KB; the one-token head config's 6 stages (120 KB) fit only the H100's, and an A10 gets 4."""
    per_stage = (config.block_n + block_m) * config.block_k * itemsize
    return max(1, min(config.num_stages, 1 + (shared_memory - SHARED_MEMORY_RESERVE) // per_stage))


@triton.jit
def small_m_dot(w_rows, x_cols, n_ok, m_ok, k_start, k_end, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, NUM_STAGES: tl.constexpr,
                DOT_PRECISION: tl.constexpr):  # noqa: ANN001, ANN201
    """acc [BLOCK_N, BLOCK_M] = W[rows, k_start:k_end] · x[:, k_start:k_end]ᵀ in fp32, streamed
    through a NUM_STAGES-deep pipeline. w_rows [BLOCK_N, 1] and x_cols [1, BLOCK_M] point at
    column 0; EVEN_K: every step is whole. Shared with rope/qkv_rope_triton.py."""
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k in tl.range(k_start, k_end, BLOCK_K, num_stages=NUM_STAGES):
        rk = k + tl.arange(0, BLOCK_K)
        if EVEN_K:
            w = tl.load(w_rows + rk[None, :], mask=n_ok[:, None], other=0.0)
            x = tl.load(x_cols + rk[:, None], mask=m_ok[None, :], other=0.0)
        else:
            k_ok = rk < k_end
            w = tl.load(w_rows + rk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            x = tl.load(x_cols + rk[:, None], mask=m_ok[None, :] & k_ok[:, None], other=0.0)
        acc = tl.dot(w, x, acc, input_precision=DOT_PRECISION)
    return acc


@triton.jit
def small_m_block(x_ptr, w_ptr, pid, M, N, k_start, k_end, stride_xm, stride_wn, BLOCK_N: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, NUM_STAGES: tl.constexpr,
                  DOT_PRECISION: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr):  # noqa: ANN001, ANN201
    """A program's part of the product: weight rows pid * BLOCK_N + [0, BLOCK_N) against every token,
    over columns [k_start, k_end). Prefetches the rows into L2 and waits for the predecessor
    (ops/pdl.py) first. Returns (acc [BLOCK_N, BLOCK_M] fp32, rows, tokens, rows' mask, tokens' mask).
    Shared with linear/head_triton.py."""
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    n_ok = rn < N
    m_ok = rm < M
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * stride_wn
    x_cols = x_ptr + rm[None, :] * stride_xm
    prefetch_rows(w_rows, w_ptr, n_ok, k_start, k_end, PREFETCH)  # a weight: before the wait (ops/pdl.py)
    pdl_enter(PDL)
    acc = small_m_dot(w_rows, x_cols, n_ok, m_ok, k_start, k_end, BLOCK_N, BLOCK_M, BLOCK_K, EVEN_K,
                      NUM_STAGES, DOT_PRECISION)
    return acc, rn, rm, n_ok, m_ok


@triton.jit
def _small_m_linear_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_os, stride_om, k_per_split,
    HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr, DOT_PRECISION: tl.constexpr, PDL: tl.constexpr,
    PREFETCH: tl.constexpr,
):  # noqa: ANN001
    split = tl.program_id(1)  # K split: this program's partial sum goes to out[split]
    k_start = split * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    if HAS_BIAS:  # a weight: read before the loop, not in a round trip after it
        rb = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        bias = tl.load(b_ptr + rb, mask=(rb < N) & (rb * 0 + split == 0), other=0.0).to(tl.float32)  # split 0 only
    acc, rn, rm, n_ok, m_ok = small_m_block(x_ptr, w_ptr, tl.program_id(0), M, N, k_start, k_end, stride_xm,
                                            stride_wn, BLOCK_N, BLOCK_M, BLOCK_K, EVEN_K, NUM_STAGES,
                                            DOT_PRECISION, PDL, PREFETCH)
    if HAS_BIAS:
        acc += bias[:, None]
    out = out_ptr + split * stride_os + rm[None, :] * stride_om + rn[:, None]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=n_ok[:, None] & m_ok[None, :])


def unreduced_splits(n: int, k: int, sms: int, config: LinearConfig = DEFAULT_CONFIG) -> int:
    """K splits for a projection whose output may stay unreduced: as many as whole programs per SM
    allow (at least one BLOCK_K step each). H100, bench_linear.py --sweep, o projection [2880, 4096]
    (45 row blocks on 132 SMs), µs at T = 1 / 8 / 32 by splits: 1: 12.4 / 12.5 / 13.0; 2 (this
    rule): 10.8 / 11.0 / 11.2; 3: 11.2 / 11.3 / 13.1; 4: 11.4 / 11.5 / 12.5; 6: 10.9 / 11.1 / 12.4."""
    return max(1, min(sms // triton.cdiv(n, config.block_n), k // config.block_k))


def fits_small_m_linear(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (x.dim() == 2 and 0 < x.shape[0] <= MAX_TOKENS and x.stride(1) == 1 and weight.stride(1) == 1
            and x.dtype == weight.dtype)


def small_m_linear_triton(
    x: torch.Tensor,  # [M, K], M <= MAX_TOKENS, last dim contiguous
    weight: torch.Tensor,  # [N, K], last dim contiguous (nn.Linear's layout)
    bias: torch.Tensor | None,  # [N]
    config: LinearConfig = DEFAULT_CONFIG,
    splits: int = 1,
) -> torch.Tensor:
    """F.linear(x, weight, bias) in x's dtype, accumulated in fp32.

    splits > 1: K is split over that many programs per row block (more of the GPU streaming a
    weight whose row blocks are fewer than its SMs), and the result is left unreduced: float32
    partials [S, M, 1, N] (bias in the first), which ops/norm/reference.py's add_rms_norm sums."""
    assert fits_small_m_linear(x, weight), (x.shape, x.stride(), weight.stride(), x.dtype, weight.dtype)
    m, k = x.shape
    n = weight.shape[0]
    assert weight.shape[1] == k and (bias is None or bias.shape == (n,))
    # Whole BLOCK_K steps per split, so only the last split can be ragged.
    k_per_split = triton.cdiv(triton.cdiv(k, splits), config.block_k) * config.block_k
    splits = triton.cdiv(k, k_per_split)
    if splits > 1:
        out = torch.empty(splits, m, 1, n, dtype=torch.float32, device=x.device)
    else:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    block_m = max(16, triton.next_power_of_2(m))
    pdl = pdl_launch(x.device)
    grid = (triton.cdiv(n, config.block_n), splits)
    _small_m_linear_kernel[grid](
        x, weight, bias if bias is not None else weight, out, m, n, k,
        x.stride(0), weight.stride(0), out.stride(0) if splits > 1 else 0, n, k_per_split,
        HAS_BIAS=bias is not None, EVEN_K=k % config.block_k == 0, BLOCK_N=config.block_n,
        BLOCK_M=block_m, BLOCK_K=config.block_k,
        NUM_STAGES=stages_that_fit(config, block_m, x.element_size(), kernel_policy(x.device).shared_memory),
        # fp32 (CPU tests): no silent TF32; bf16 ignores the setting.
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", PDL=pdl,
        PREFETCH=prefetch_lines(grid[0] * grid[1], x.device),
        num_warps=config.num_warps, launch_pdl=pdl,
    )
    return out
