"""Programmatic dependent launch (PDL): a decode layer's kernels overlap their neighbours' edges.

A decode step at batch 1 is ~200 short kernels, each waiting for the one before it. Normally a
kernel's programs are placed on the SMs only once its predecessor has finished and flushed its
writes. Launched with PDL (Hopper and later), a kernel's grid is placed as soon as every program
of its predecessor has called `griddepcontrol.launch_dependents`; its programs then run up to
`griddepcontrol.wait`, which returns once the predecessor has completed and its writes are
visible. Work that reads nothing the predecessor writes (the step's own inputs, the weights) may
go before the wait, and so may L2 prefetches (`prefetch_l2`: hints, which never change a result)
of what the kernel reads after it.

The rule every kernel here follows, so that the guarantee is transitive along the chain:
wait first, then let the dependents launch (`pdl_enter`). A kernel launched with PDL that never
waited could run beside its predecessor; one that let its dependents launch before waiting would
let them run beside its own predecessor. A kernel that reads only the step's inputs (the inputs
are copied before the CUDA graph starts) or constant weights before its wait is safe, because its
predecessor could only trigger it after waiting itself.

Kernels without PDL (PyTorch's, cuBLAS's) keep the usual full ordering on both sides.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from osserve.ops.policy import kernel_policy

# The switches benchmarks flip to compare with and without (bench_decode.py --ab pdl, --ab
# prefetch) and one GPU test flips (PDL changes no bit); the kernels read them at launch
# (`pdl_launch`, `prefetch_before_wait`). They stay module constants, not policy fields: nothing a
# user sets reaches them, and the A/B scripts flip them between engines built in one process.
ENABLED = True
PREFETCH = True  # with PDL, kernels ask L2 for some of what they read after the wait (prefetch_l2)


def pdl_launch(device: torch.device) -> bool:
    """Whether kernels on `device` launch with PDL: where the kernel policy is Hopper's (sm_90,
    compiled: ops/policy.py), and not switched off."""
    return ENABLED and kernel_policy(device).hopper


def prefetch_before_wait(device: torch.device) -> bool:
    """Whether kernels on `device` prefetch into L2 before their wait: they launch with PDL and
    PREFETCH is on."""
    return PREFETCH and pdl_launch(device)


@triton.jit
def pdl_enter(PDL: tl.constexpr):  # noqa: ANN201
    """Wait for the predecessor's writes, then let the successor's grid launch (module docstring)."""
    if PDL:
        tl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
        tl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=tl.int32,
                                  is_pure=False, pack=1)


@gluon.jit
def pdl_enter_gluon(PDL: gl.constexpr):  # noqa: ANN201
    """pdl_enter for the Gluon kernels (a Gluon kernel cannot call a triton.jit function)."""
    if PDL:
        gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)


@triton.jit
def prefetch_l2(ptrs):  # noqa: ANN001, ANN201
    """Ask L2 for the 128-byte lines holding `ptrs` (addresses the kernel reads later): a hint
    with no result, for the work before the wait."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [ptrs.to(tl.int64)], dtype=tl.int32,
                              is_pure=False, pack=1)


@triton.jit
def prefetch_rows(w_rows, w_ptr, n_ok, k_start, k_end, LINES: tl.constexpr):  # noqa: ANN001, ANN201
    """prefetch_l2 of the first LINES 128-byte lines of each row from column k_start (below k_end):
    w_rows [N, 1] points at the rows' column 0 of the matrix at w_ptr, n_ok [N] masks them."""
    if LINES > 0:
        k = k_start + tl.arange(0, LINES) * (128 // (w_ptr.dtype.element_ty.primitive_bitwidth // 8))
        ok = n_ok[:, None] & (k < k_end)[None, :]
        prefetch_l2(tl.where(ok, w_rows + k[None, :], w_ptr))
