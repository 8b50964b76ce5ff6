"""One layer's experts as the checkpoint stores them and as the fused kernels take them, and the
constants every MoE path shares. A leaf: it imports nothing of its sibling modules, which all import it.

Expert weights stay MXFP4 (ops/mxfp4/reference.py): gate_up [E, 2I, H] with gate and up interleaved
by row (even rows gate, odd rows up), down [E, H, I], both out x in, plus biases.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from osserve.ops.mxfp4.reference import dequantize_mxfp4

SWIGLU_ALPHA = 1.702  # glu * sigmoid(SWIGLU_ALPHA * glu)
# The 4-bit kernels' dequantisation returns the weights times 2^-62 (dequant_triton.py); their
# epilogues multiply it back.
UNSCALE = 2.0**62


@dataclass
class PreparedExperts:
    """One layer's experts in the kernel's layout. Built once at load by prepare_mxfp4_experts."""

    w1: torch.Tensor  # [E, 2I, H/2] uint8: gate rows 0..I-1, up rows I..2I-1; nibbles re-paired
    s1: torch.Tensor  # [E, 2I, H/32] uint8 E8M0 scales, same row order; stored group-major
    b1: torch.Tensor  # [E, 2I] float32
    w2: torch.Tensor  # [E, H, I/2] uint8
    s2: torch.Tensor  # [E, H, I/32] uint8, stored group-major
    b2: torch.Tensor  # [E, H] float32
    # True: w1/w2 are int32 words in MMA-fragment order, stored with s1/s2 tile-major
    # (mxfp4/fragments.py), for moe/gluon.py; w is then [E, rows/64, 64*K/8], s [E, rows/64, K steps, 64, 4].
    fragments: bool = False
    # moe_gluon_ws.descriptors of (w1, s1) and of (w2, s2), made at the first launch that needs them
    descriptors: tuple = field(default=(), repr=False, compare=False)

    @property
    def num_experts(self) -> int:
        return self.w1.shape[0]

    @property
    def hidden(self) -> int:
        return self.b2.shape[1]

    @property
    def intermediate(self) -> int:
        return self.b1.shape[1] // 2


@dataclass
class ExpertWeights:
    """One layer's experts as stored in the checkpoint (MXFP4), plus the fused kernel's layout."""

    gate_up_blocks: torch.Tensor | None  # [E, 2I, H/32, 16] uint8
    gate_up_scales: torch.Tensor | None  # [E, 2I, H/32] uint8
    gate_up_bias: torch.Tensor  # [E, 2I]
    down_blocks: torch.Tensor | None  # [E, H, I/32, 16] uint8
    down_scales: torch.Tensor | None  # [E, H, I/32] uint8
    down_bias: torch.Tensor  # [E, H]
    prepared: PreparedExperts | None = None  # the kernels' layout, set once at load (layout.py)

    @property
    def num_experts(self) -> int:
        return self.gate_up_bias.shape[0]

    def gate_up(self, dtype: torch.dtype) -> torch.Tensor:
        assert self.gate_up_blocks is not None and self.gate_up_scales is not None
        return dequantize_mxfp4(self.gate_up_blocks, self.gate_up_scales, dtype)

    def down(self, dtype: torch.dtype) -> torch.Tensor:
        assert self.down_blocks is not None and self.down_scales is not None
        return dequantize_mxfp4(self.down_blocks, self.down_scales, dtype)
