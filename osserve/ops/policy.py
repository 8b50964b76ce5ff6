"""Which family of kernels runs on a GPU: the Hopper kernels or the portable Triton ones.

The fast path was tuned on the H100, and four of its pieces exist on sm_90 alone:
- the Gluon MoE kernels (ops/moe/gluon*.py: warpgroup MMA, TMA), which need their own weight layout;
- programmatic dependent launch (ops/pdl.py: `griddepcontrol`, and the L2 prefetches issued before
  its wait);
- the packed bf16 dequantiser of the swapped MoE kernel (ops/moe/dequant_triton.py: `mul.rn.bf16x2`);
- the Gluon decode kernel of an FP8 KV cache (ops/attention/fp8_decode_gluon.py; elsewhere the
  Triton one reads it).
Everything else is plain Triton (`tl.dot`, no inline PTX), which compiles for sm_80 and later
(tests/ops/test_compile_targets.py compiles it for sm_80, sm_86 and sm_89 without a GPU).

The policy: the Hopper kernels on compute capability 9.x, the portable ones everywhere else. That
includes Blackwell (sm_100, sm_120): the Gluon kernels are written for wgmma, which Blackwell does not
have, and PDL there has never been run, so the portable path is the one that is known to compile. On
AMD (ROCm reports its gfx arch as the capability, gfx90a as 9.0) the portable path too. Below sm_80
there are no bf16 tensor cores: such a GPU is refused at load (`KernelPolicy.refusal`).
OSSERVE_PORTABLE_KERNELS=1 or `--portable-kernels` forces the portable path on any GPU: for tests
and benchmarks on the H100, and for a user who hits a bug in a Hopper kernel.

It is decided once, at load (engine/load.py), from the device and the switch; the runner holds it and
enters it (`use_policy`) around every call into the model, and the kernels' launchers read it
(`kernel_policy`). Outside any `use_policy` (tests and benchmarks calling an op), it is decided from
the tensor's device and the environment variable.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch

PORTABLE_ENV = "OSSERVE_PORTABLE_KERNELS"
HOPPER = "hopper"
PORTABLE = "portable"

# Shared memory a block may use (the opt-in maximum, bytes) where the driver does not say (and for
# the compile check's targets, which have no device): CUDA's tables by compute capability.
SHARED_MEMORY_BY_CAPABILITY = {
    (8, 0): 166_912,  # A100: 163 KB
    (8, 6): 101_376,  # A10, A40, RTX 30xx: 99 KB
    (8, 7): 166_912,  # Jetson Orin
    (8, 9): 101_376,  # L4, L40S, RTX 40xx: 99 KB
    (9, 0): 232_448,  # H100, H200: 227 KB
    (10, 0): 232_448,  # B200
    (12, 0): 101_376,  # RTX 50xx
}
SMALLEST_SHARED_MEMORY = 101_376  # unknown capabilities: the smallest of sm_80 and later
AMD_SHARED_MEMORY = 65_536


@dataclass(frozen=True)
class KernelPolicy:
    """The kernels a device runs: `path` is HOPPER or PORTABLE, `reason` says why (printed at start-up)."""

    path: str
    capability: tuple[int, int] | None  # None: no CUDA device (the CPU, the interpreter)
    shared_memory: int  # bytes a block may use: pipelined kernels pick their stages to fit (linear)
    reason: str
    refusal: str | None = None  # why this GPU cannot run osserve at all (load.py refuses it)

    @property
    def hopper(self) -> bool:
        """The Gluon MoE kernels, PDL and the sm_90 inline PTX."""
        return self.path == HOPPER

    def describe(self) -> str:
        """One line for the start-up log."""
        if self.hopper:
            return (f"kernels: Hopper (Gluon MoE and FP8 decode, programmatic dependent launch, sm_90 PTX; "
                    f"{self.reason})")
        return f"kernels: portable Triton ({self.reason})"


def decide(capability: tuple[int, int] | None, *, forced: bool = False, amd: bool = False,
           shared_memory: int | None = None) -> KernelPolicy:
    """The policy for a device of `capability` (None: no CUDA device); `forced`: the switch is on."""
    if capability is None:
        return KernelPolicy(PORTABLE, None, SHARED_MEMORY_BY_CAPABILITY[(9, 0)], "no CUDA device")
    major, minor = capability
    smem = shared_memory or SHARED_MEMORY_BY_CAPABILITY.get(capability, SMALLEST_SHARED_MEMORY)
    arch = f"sm_{major}{minor}"
    if amd:  # CDNA and RDNA blocks get 64 KB of LDS (ROCm reports no opt-in maximum)
        return KernelPolicy(PORTABLE, capability, shared_memory or AMD_SHARED_MEMORY,
                            "AMD GPU (ROCm): untested")
    if capability < (8, 0):
        return KernelPolicy(PORTABLE, capability, smem, arch, refusal=(
            f"osserve needs an NVIDIA GPU of compute capability 8.0 or later (bf16 tensor cores); this one is {arch}"))
    if forced:
        return KernelPolicy(PORTABLE, capability, smem, f"{arch}, forced by {PORTABLE_ENV}=1 or --portable-kernels")
    if major == 9:
        return KernelPolicy(HOPPER, capability, smem, arch)
    if major >= 10:
        return KernelPolicy(PORTABLE, capability, smem, f"{arch}: the Hopper kernels are not built for Blackwell")
    return KernelPolicy(PORTABLE, capability, smem, arch)


def forced_by_environment() -> bool:
    return os.environ.get(PORTABLE_ENV, "0").strip().lower() not in ("", "0", "false", "no", "off")


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.lru_cache(maxsize=16)
def _device_facts(index: int) -> tuple[tuple[int, int], bool, int | None]:
    props = torch.cuda.get_device_properties(index)
    return (props.major, props.minor), torch.version.hip is not None, getattr(props, "shared_memory_per_block_optin",
                                                                               None)


def detect(device: torch.device, forced: bool = False) -> KernelPolicy:
    """The policy for `device`, the switch on where `forced` or OSSERVE_PORTABLE_KERNELS is set."""
    forced = forced or forced_by_environment()
    if device.type != "cuda" or interpreting():  # the interpreter runs no PTX and has no grid dependencies
        return decide(None, forced=forced)
    capability, amd, smem = _device_facts(device.index if device.index is not None else torch.cuda.current_device())
    return decide(capability, forced=forced, amd=amd, shared_memory=smem)


_current: ContextVar[KernelPolicy | None] = ContextVar("osserve_kernel_policy", default=None)


def kernel_policy(device: torch.device) -> KernelPolicy:
    """What the launchers read: the policy entered by `use_policy`, else `detect(device)`."""
    policy = _current.get()
    return policy if policy is not None else detect(device)


@contextmanager
def use_policy(policy: KernelPolicy) -> Iterator[None]:
    """Kernels launched inside follow `policy` (the runner enters the one decided at load)."""
    token = _current.set(policy)
    try:
        yield
    finally:
        _current.reset(token)
