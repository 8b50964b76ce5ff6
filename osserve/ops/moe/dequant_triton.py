"""Triton device functions the 4-bit MoE kernels share (swapped.py, tiled.py, dense.py):
MXFP4 dequantisation into registers and gpt-oss's clamped SwiGLU."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from osserve.ops.policy import kernel_policy


@triton.jit
def dequant_pair(packed, scale):
    """packed [N, B] uint8, scale [N, B] uint8 -> (low, high) nibble values * 2^-62, float32 [N, B].

    E2M1 s|e1 e0|m placed at float32 bits 31 | 24..23 | 22 reads as the value times 2^-126 (the
    subnormal code 0.5 lands on a float32 subnormal). One multiply by 2^(s+64-127) (exponent field
    s+64: valid for every scale s <= 190) gives value * 2^(s-127) * 2^-62, comfortably in bf16's
    normal range; the constant 2^62 is factored out of the dot and restored once per output.
    """
    p = packed.to(tl.uint32)
    lo = ((p & 0x7) << 22) | ((p & 0x8) << 28)
    hi = ((p & 0x70) << 18) | ((p & 0x80) << 24)
    sf = ((scale.to(tl.uint32) + 64) << 23).to(tl.float32, bitcast=True)
    return lo.to(tl.float32, bitcast=True) * sf, hi.to(tl.float32, bitcast=True) * sf


# Same function as dequant_pair but on packed registers, straight to bf16 (sm_90: mul.rn.bf16x2):
# 4 bytes -> 4 low + 4 high values in ~4 instructions per value instead of ~12. In the token-tiled
# kernel it measured SLOWER on the H100 (T=1: 142 vs 109 us; T=2048: 3.7 vs 3.2 ms; opt-in there), in
# the swapped kernel faster (its default: NOTES-moe.md). sm_90 PTX: `packed_dequant` says where it
# may run. $4 = 4 weight bytes, $5 = their scales.
_DEQUANT_PTX = tl.constexpr("""{
.reg .b32 t0, t1, s0, s1, u, v;
prmt.b32 t0, $4, 0, 0x4140;
prmt.b32 t1, $4, 0, 0x4342;
prmt.b32 s0, $5, 0, 0x4140;
prmt.b32 s1, $5, 0, 0x4342;
add.u32 s0, s0, 0x00400040;
shl.b32 s0, s0, 7;
add.u32 s1, s1, 0x00400040;
shl.b32 s1, s1, 7;
shl.b32 u, t0, 6;
and.b32 u, u, 0x01C001C0;
shl.b32 v, t0, 12;
and.b32 v, v, 0x80008000;
or.b32 u, u, v;
mul.rn.bf16x2 $0, u, s0;
shl.b32 u, t1, 6;
and.b32 u, u, 0x01C001C0;
shl.b32 v, t1, 12;
and.b32 v, v, 0x80008000;
or.b32 u, u, v;
mul.rn.bf16x2 $1, u, s1;
shl.b32 u, t0, 2;
and.b32 u, u, 0x01C001C0;
shl.b32 v, t0, 8;
and.b32 v, v, 0x80008000;
or.b32 u, u, v;
mul.rn.bf16x2 $2, u, s0;
shl.b32 u, t1, 2;
and.b32 u, u, 0x01C001C0;
shl.b32 v, t1, 8;
and.b32 v, v, 0x80008000;
or.b32 u, u, v;
mul.rn.bf16x2 $3, u, s1;
}""")


def packed_dequant(wanted: bool, x: torch.Tensor) -> bool:
    """FAST for `dequant`: where the caller wants it, the activations are bf16 and the kernel policy is
    Hopper's (ops/policy.py: mul.rn.bf16x2 is sm_90 PTX, and the interpreter runs no PTX)."""
    return wanted and x.dtype == torch.bfloat16 and kernel_policy(x.device).hopper


@triton.jit
def dequant(packed, scale, dtype: tl.constexpr, FAST: tl.constexpr):
    """(low, high) nibble values * 2^-62 in `dtype` for the dot: inline PTX on the GPU for bf16."""
    if FAST:
        lo, hi = tl.inline_asm_elementwise(
            _DEQUANT_PTX, "=r,=r,=r,=r,r,r", [packed, scale],
            dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4,
        )
        return lo, hi
    else:
        lo, hi = dequant_pair(packed, scale)
        return lo.to(dtype), hi.to(dtype)


@triton.jit
def swiglu(gate, up, limit, ALPHA: tl.constexpr):
    """gpt-oss's clamped SwiGLU (ops/moe/reference.py swiglu) on de-interleaved gate and up tiles."""
    gate = tl.minimum(gate, limit)
    up = tl.minimum(tl.maximum(up, -limit), limit)
    return gate * tl.sigmoid(ALPHA * gate) * (up + 1.0)
