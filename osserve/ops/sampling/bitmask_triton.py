"""A grammar's token mask applied to the logits in one pass: each program expands one block of a
masked row's words into bits in registers and writes -inf where a token is forbidden (the
specification: reference.py). Reads 1/32 of a float32 row's bytes in mask words, and touches
only the rows that have a mask."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096  # tokens per program


@triton.jit
def _apply_bitmask_kernel(logits_ptr, rows_ptr, bits_ptr, vocab, stride_row, stride_bits,
                          BLOCK: tl.constexpr):  # noqa: ANN001
    r = tl.program_id(0)
    block = tl.program_id(1)
    row = tl.load(rows_ptr + r)
    cols = block * BLOCK + tl.arange(0, BLOCK)
    ok = cols < vocab
    words = tl.load(bits_ptr + r * stride_bits + cols // 32, mask=ok, other=0)
    allowed = ((words >> (cols % 32)) & 1) != 0
    ptrs = logits_ptr + row.to(tl.int64) * stride_row + cols
    tl.store(ptrs, float("-inf"), mask=ok & ~allowed)


def apply_token_bitmask_triton(logits: torch.Tensor, rows: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """apply_token_bitmask_reference, on the device. logits [B, V] (float32, bf16 or float16) with
    unit column stride."""
    vocab = logits.shape[1]
    assert logits.stride(1) == 1 and bits.dtype == torch.int32 and bits.shape[0] == rows.shape[0]
    if rows.numel():
        _apply_bitmask_kernel[(rows.numel(), triton.cdiv(vocab, BLOCK))](
            logits, rows, bits, vocab, logits.stride(0), bits.stride(0), BLOCK=BLOCK, num_warps=8)
    return logits
