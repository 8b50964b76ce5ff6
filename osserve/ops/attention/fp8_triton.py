"""The FP8 KV format (kv_format.py) inside Triton kernels: a vector's scale, a stored scale's value,
and e4m3 codes rounded exactly as PyTorch's `.to(torch.float8_e4m3fn)` rounds (to nearest, ties to
even), for the kernels that write the cache (attention/paged_triton.py, rope/) and read it.

The decode kernel multiplies in float16, not bf16: e4m3 codes become float16 exactly in one
instruction a pair (`cvt.rn.f16x2.e4m3x2`), where bf16 took three (by way of f16), and float16
keeps more of q, p and the codes than bf16 would. The query is clamped into float16's range, and
p times the value scales is divided by the tile's largest value scale (kept in [0, 1]) and the
product multiplied by it again in float32. The codes are converted by inline PTX, which Triton
does not move behind the tile's trip into the dot's operand layout: moved there (as it moves a
`.to`), the value codes of one column, 64 bytes apart, were gathered a byte at a time from shared
memory (`LDS.U8`; sm_90 SASS of the decode loop: 901 instructions a tile with bf16 products, 536
so, against 419 for a bf16 cache).

The rounding is done here in float32, onto e4m3's grid, before the cast: the cast then only packs an
exact value, which the GPU and Triton's CPU interpreter both do exactly (the interpreter's own
float32 -> float8 rounding loses the carry when a value rounds up into the next power of two:
124.2 became 64, 2026-11-25, Triton 3.9), so the CPU tests check the code the GPU runs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Triton converts to and from e4m3 (fp8e4nv) on compute capability 8.9 and later (Ada, Hopper,
# Blackwell); on sm_80/sm_86 the kernels do not compile, and engine/load.py refuses an FP8 cache there.
MIN_CAPABILITY = (8, 9)


@triton.jit
def _pow2(biased):  # noqa: ANN001
    """2^(biased - 127) as float32, exactly (the int placed in float32's exponent field)."""
    return (biased.to(tl.int32) << 23).to(tl.float32, bitcast=True)


@triton.jit
def token_scale(amax):  # noqa: ANN001
    """The scale of a vector whose largest magnitude is amax (float32 >= 0): amax / 448 rounded to
    bf16 to nearest-even (kv_format.token_scales), returned as float32. The division and the rounding
    are done exactly (the interpreter's float32 -> bf16 cast truncates; the GPU's division is not
    IEEE by default)."""
    bits = tl.math.div_rn(amax, 448.0).to(tl.int32, bitcast=True)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)


@triton.jit
def scale_value(s):  # noqa: ANN001
    """A stored scale (bf16, 0 for a slot never written) as float32: the factor that decodes its codes."""
    return s.to(tl.float32)


@triton.jit
def to_e4m3(x, s):  # noqa: ANN001
    """e4m3 codes of x / s (x float32, s a float32 scale broadcastable to it; s = 0: codes 0)."""
    y = tl.math.div_rn(x, tl.where(s == 0.0, 1.0, s))
    y = tl.minimum(tl.maximum(y, -448.0), 448.0)
    a = tl.abs(y)
    # e4m3's step at |y|: 2^(floor(log2|y|) - 3) (three mantissa bits), 2^-9 below 2^-6 (subnormals).
    step = tl.maximum(((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 3, 118)
    n = a * _pow2(254 - step)  # |y| in steps: exact, a power-of-two factor
    f = tl.floor(n)
    r = n - f
    odd = f - 2.0 * tl.floor(f * 0.5)
    f = tl.where((r > 0.5) | ((r == 0.5) & (odd == 1.0)), f + 1.0, f)
    sign = y.to(tl.int32, bitcast=True) & -2147483648  # y's sign bit (-0.0 stays -0.0, as in PyTorch)
    rounded = ((f * _pow2(step)).to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)
    return rounded.to(tl.float8e4nv)


@triton.jit
def query_f16(q):  # noqa: ANN001
    """A query tile as float16 for the FP8 products (module docstring), clamped into its range."""
    return tl.minimum(tl.maximum(q.to(tl.float32), -65504.0), 65504.0).to(tl.float16)


@triton.jit
def codes_f16(codes, ASM: tl.constexpr):  # noqa: ANN001
    """e4m3 codes as float16 (exact). ASM: by inline PTX, which stays where it is written (module
    docstring): marked impure, which is what keeps Triton from moving it, though it has no side
    effect. Triton's interpreter runs no PTX, so there (ASM False) by a cast."""
    if ASM:
        return tl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
            "=r,=r,r", [codes], dtype=tl.float16, is_pure=False, pack=4)
    else:
        return codes.to(tl.float16)


@triton.jit
def fp8_scores(q16, k_codes, k_scale, scale_log2e, ASM: tl.constexpr):  # noqa: ANN001
    """q [M, D] (query_f16) against a tile's key codes [N, D] and scales [N] (float32): the scores
    [M, N] in float32, times scale_log2e."""
    return tl.dot(q16, tl.trans(codes_f16(k_codes, ASM))) * (k_scale * scale_log2e)[None, :]


@triton.jit
def fp8_values(p, v_codes, v_scale, ASM: tl.constexpr):  # noqa: ANN001
    """p [M, N] (float32, in [0, 1]) times a tile's value codes [N, D] with their scales [N]: [M, D]
    in float32. The scales join p's columns divided by the largest of them, which multiplies the
    product (module docstring); an all-zero tile (unwritten or masked slots) divides by 1."""
    v_max = tl.max(v_scale, 0)
    v_max = tl.where(v_max == 0.0, 1.0, v_max)
    weights = (p * (v_scale * (1.0 / v_max))[None, :]).to(tl.float16)
    return tl.dot(weights, codes_f16(v_codes, ASM)) * v_max


def scale_args(k_scales: torch.Tensor | None, v_scales: torch.Tensor | None, placeholder: torch.Tensor,
               ) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int, int]]:
    """A kernel's scale arguments: the K and V scale tensors [num_blocks, block_size, kv_heads] and
    their (block, slot, head) strides, which must agree; for a cache in the model's dtype (no
    scales: FP8=False, never read) `placeholder` twice and zero strides."""
    if k_scales is None or v_scales is None:
        return placeholder, placeholder, (0, 0, 0)
    assert k_scales.stride() == v_scales.stride() and k_scales.dtype == v_scales.dtype == torch.bfloat16
    return k_scales, v_scales, (k_scales.stride(0), k_scales.stride(1), k_scales.stride(2))
