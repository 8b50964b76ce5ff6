"""RMSNorm and residual-add + RMSNorm in one pass each (one program per row)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, H: tl.constexpr, eps,
                         HAS_RES: tl.constexpr, BLOCK: tl.constexpr):  # noqa: ANN001
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x = tl.load(x_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        # gpt-oss adds in the activations' dtype before normalising: round the sum the same way.
        x = (x + tl.load(res_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32))
        x = x.to(sum_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * H + cols, x, mask=mask)
        x = x.to(tl.float32)
    var = tl.sum(x * x, axis=0) / H
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = w * (x * tl.rsqrt(var + eps))
    tl.store(out_ptr + row * H + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def add_rms_norm_triton(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual), x + residual); with residual None: (norm(x), x)."""
    t, h = x.shape
    x = x.contiguous()
    out = torch.empty_like(x)
    summed = torch.empty_like(x) if residual is not None else x
    if t:
        _add_rms_norm_kernel[(t,)](x, residual.contiguous() if residual is not None else x, weight, out, summed,
                                   h, eps, HAS_RES=residual is not None, BLOCK=triton.next_power_of_2(h),
                                   num_warps=4 if h <= 4096 else 8)
    return out, summed
