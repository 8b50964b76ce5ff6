"""Temperature sampling in one pass over the logits: the Gumbel-max race, fused.

Sampling from softmax(z / T) is taking argmax(z / T + G) with G i.i.d. Gumbel(0, 1), the same
race as the sampler's argmax(p / E) with E ~ Exp(1) (G = -log E, and log p differs from z / T by
a per-row constant). PyTorch ran it as ~10 passes over the [B, vocab] float32 logits (greedy
argmax, divide, softmax, noise, divide, argmax: ~1.9 GB at batch 235, most of a millisecond per
serving step); here each program reads its row once and draws its Gumbel noise in registers
(Philox, `tl.rand`) from the row's own seed. Rows with temperature 0 take the plain argmax. Ties
go to the lowest token id, as torch.argmax.

The noise: one Philox call (ten rounds) gives four uniforms, and a loop step of BLOCK tokens takes
them from BLOCK / 4 calls, call i's four for tokens start + i + k * BLOCK / 4 (k = 0..3), its
counter start / 4 + i; steps start at multiples of BLOCK whatever the split, so a token's draw
depends on (seed, token id) alone. With a call a token (`tl.rand`) the race over a 20b serving
step's 51 M logits (batch 256) took 259 us on an H100, with a call for four 180 (bench_sampling.py).
The logits may be float32 or the model's dtype (bf16: the head's output at serving batches, read
as it is instead of widened by a pass of its own); each is widened in registers, exactly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 2048  # tokens per loop step of a program


@triton.jit
def _race(row_ptr, cols, hi, u, greedy, inv_temp, best, best_id):  # noqa: ANN001
    """One sub-block's tokens `cols` (their uniforms u) against each lane's best so far."""
    ok = cols < hi
    z = tl.load(row_ptr + cols, mask=ok, other=float("-inf")).to(tl.float32)
    gumbel = -tl.log(-tl.log(u))  # u = 0 gives -inf: that token cannot win
    score = tl.where(greedy, z, z * inv_temp + gumbel)
    score = tl.where(ok, score, float("-inf"))
    better = score > best  # strict: each lane keeps its lowest id among equals (its ids only grow)
    return tl.where(better, score, best), tl.where(better, cols, best_id)


@triton.jit
def _gumbel_argmax_kernel(logits_ptr, temp_ptr, seed_ptr, part_val_ptr, part_id_ptr, vocab, stride_row,
                          per_split, num_splits, BLOCK: tl.constexpr):  # noqa: ANN001
    QUARTER: tl.constexpr = BLOCK // 4
    row = tl.program_id(0)
    split = tl.program_id(1)
    temp = tl.load(temp_ptr + row)
    greedy = temp <= 0.0
    inv_temp = 1.0 / tl.where(greedy, 1.0, temp)
    seed = tl.load(seed_ptr + row)
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    best = tl.full([QUARTER], float("-inf"), dtype=tl.float32)
    best_id = tl.zeros([QUARTER], dtype=tl.int32)
    lo = split * per_split
    hi = tl.minimum(lo + per_split, vocab)
    i = tl.arange(0, QUARTER)
    for start in range(lo, hi, BLOCK):
        u0, u1, u2, u3 = tl.rand4x(seed, start // 4 + i)  # start is a multiple of BLOCK (docstring)
        best, best_id = _race(row_ptr, start + i, hi, u0, greedy, inv_temp, best, best_id)
        best, best_id = _race(row_ptr, start + QUARTER + i, hi, u1, greedy, inv_temp, best, best_id)
        best, best_id = _race(row_ptr, start + 2 * QUARTER + i, hi, u2, greedy, inv_temp, best, best_id)
        best, best_id = _race(row_ptr, start + 3 * QUARTER + i, hi, u3, greedy, inv_temp, best, best_id)
    top = tl.max(best, axis=0)
    chosen = tl.min(tl.where(best == top, best_id, vocab), axis=0)
    tl.store(part_val_ptr + row * num_splits + split, top)
    tl.store(part_id_ptr + row * num_splits + split, chosen.to(tl.int64))


def gumbel_argmax_triton(logits: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor,
                         num_splits: int | None = None, block: int = BLOCK, num_warps: int = 8,
                         programs_per_sm: int = 4) -> torch.Tensor:
    """Token ids [B] int64: row i sampled from softmax(logits[i] / temperature[i]) with the noise of
    seeds[i] (int64), or its argmax where temperature[i] <= 0; logits float32, bf16 or float16.
    Each row's vocabulary is split over num_splits programs (default: enough for programs_per_sm
    programs per SM), whose winners a last argmax compares (the first, lowest-id split wins a tie);
    the draws do not depend on the split. block / num_warps: the launch (benchmarks/bench_sampling.py
    compares them; a block other than BLOCK draws other noise, as the module docstring says)."""
    b, vocab = logits.shape
    assert logits.stride(1) == 1 and temperature.shape == (b,) and seeds.shape == (b,)
    blocks = triton.cdiv(vocab, block)
    if num_splits is None:
        sms = torch.cuda.get_device_properties(logits.device).multi_processor_count if logits.is_cuda else 1
        num_splits = triton.cdiv(programs_per_sm * sms, max(b, 1))
    num_splits = max(1, min(num_splits, blocks))
    per_split = triton.cdiv(blocks, num_splits) * block
    num_splits = triton.cdiv(vocab, per_split)
    part_val = torch.empty(b, num_splits, dtype=torch.float32, device=logits.device)
    part_id = torch.empty(b, num_splits, dtype=torch.int64, device=logits.device)
    if b == 0:
        return part_id[:, 0]
    _gumbel_argmax_kernel[(b, num_splits)](logits, temperature, seeds, part_val, part_id, vocab, logits.stride(0),
                                           per_split, num_splits, BLOCK=block, num_warps=num_warps)
    if num_splits == 1:
        return part_id[:, 0]
    return part_id.gather(1, part_val.argmax(1, keepdim=True))[:, 0]
