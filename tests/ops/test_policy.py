"""The kernel policy (ops/policy.py): which GPUs get the Hopper kernels, that the switch forces the
portable ones, and that every Hopper-only piece (PDL, the Gluon MoE and FP8 decode, the sm_90 PTX dequantiser)
follows it, on the CPU: a `torch.device("cuda")` object is only a name here, and the policy is
entered as the runner enters it."""

from __future__ import annotations

import pytest
import torch

from osserve.ops import pdl
from osserve.ops.attention import fp8_decode_gluon
from osserve.ops.linear.small_m_triton import DEFAULT_CONFIG, stages_that_fit
from osserve.ops.moe import gluon
from osserve.ops.moe.dequant_triton import packed_dequant
from osserve.ops.policy import (
    HOPPER,
    PORTABLE,
    PORTABLE_ENV,
    SHARED_MEMORY_BY_CAPABILITY,
    decide,
    detect,
    forced_by_environment,
    kernel_policy,
    use_policy,
)

CUDA = torch.device("cuda")


@pytest.mark.parametrize(("capability", "path"), [
    ((9, 0), HOPPER),  # H100, H200, GH200
    ((8, 0), PORTABLE),  # A100
    ((8, 6), PORTABLE),  # A10, RTX 3090
    ((8, 7), PORTABLE),  # Jetson Orin
    ((8, 9), PORTABLE),  # L4, RTX 4090
    ((10, 0), PORTABLE),  # B200: no wgmma, PDL never run there
    ((12, 0), PORTABLE),  # RTX 5090
])
def test_the_hopper_kernels_on_sm_90_only(capability: tuple[int, int], path: str) -> None:
    policy = decide(capability)
    assert policy.path == path and policy.hopper == (path == HOPPER)
    assert policy.refusal is None
    assert f"sm_{capability[0]}{capability[1]}" in policy.describe()
    assert policy.shared_memory == SHARED_MEMORY_BY_CAPABILITY[capability]


def test_blackwell_says_why_it_gets_the_portable_kernels() -> None:
    assert "Blackwell" in decide((10, 0)).reason and "Blackwell" in decide((12, 0)).describe()


def test_the_switch_forces_the_portable_kernels_on_hopper() -> None:
    policy = decide((9, 0), forced=True)
    assert policy.path == PORTABLE and PORTABLE_ENV in policy.describe()
    assert policy.shared_memory == SHARED_MEMORY_BY_CAPABILITY[(9, 0)]  # still the H100's own


def test_amd_is_never_hopper() -> None:
    """ROCm reports the gfx arch as the capability: an MI250 (gfx90a) reads as 9.0."""
    policy = decide((9, 0), amd=True)
    assert policy.path == PORTABLE and "AMD" in policy.reason and policy.refusal is None
    assert policy.shared_memory == 65_536


def test_older_than_ampere_is_refused_with_a_reason() -> None:
    refusal = decide((7, 5)).refusal  # T4
    assert refusal is not None and "8.0 or later" in refusal and "sm_75" in refusal
    assert decide((8, 0)).refusal is None


def test_the_device_reports_its_own_shared_memory() -> None:
    assert decide((8, 6), shared_memory=123_456).shared_memory == 123_456
    assert decide((8, 8)).shared_memory == min(SHARED_MEMORY_BY_CAPABILITY.values())  # unknown: the smallest


@pytest.mark.parametrize(("value", "forced"), [("1", True), ("true", True), ("yes", True), ("0", False),
                                               ("", False), ("off", False), (None, False)])
def test_the_environment_variable(value: str | None, forced: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if value is None:
        monkeypatch.delenv(PORTABLE_ENV, raising=False)
    else:
        monkeypatch.setenv(PORTABLE_ENV, value)
    assert forced_by_environment() == forced


def test_no_cuda_device_is_portable() -> None:
    policy = detect(torch.device("cpu"))
    assert policy.path == PORTABLE and policy.capability is None and policy.refusal is None
    assert kernel_policy(torch.device("cpu")) == policy


def test_the_entered_policy_wins_and_is_left_behind() -> None:
    hopper = decide((9, 0))
    with use_policy(hopper):
        assert kernel_policy(CUDA) is hopper
        with use_policy(decide((8, 6))):
            assert kernel_policy(CUDA).path == PORTABLE
        assert kernel_policy(CUDA) is hopper
    assert kernel_policy(torch.device("cpu")).path == PORTABLE


@pytest.mark.parametrize("capability", [(9, 0), (8, 6)])
def test_each_hopper_piece_follows_the_policy(capability: tuple[int, int]) -> None:
    """PDL, the Gluon MoE, the Gluon FP8 decode and the packed dequantiser's sm_90 PTX run under the
    Hopper policy, and none of them under the portable one; the pipelined linear kernels size their stages to the
    policy's shared memory."""
    policy = decide(capability)
    bf16 = torch.zeros(1, dtype=torch.bfloat16)
    with use_policy(policy):
        assert pdl.pdl_launch(CUDA) == policy.hopper
        assert pdl.prefetch_before_wait(CUDA) == policy.hopper
        assert gluon.supported(CUDA, 2880, 2880) == policy.hopper
        assert fp8_decode_gluon.supported(CUDA, 64, 16, 8) == policy.hopper
        assert packed_dequant(True, bf16) == policy.hopper
        assert not packed_dequant(False, bf16) and not packed_dequant(True, bf16.float())
        per_stage = (DEFAULT_CONFIG.block_n + 32) * DEFAULT_CONFIG.block_k * 2
        stages = stages_that_fit(DEFAULT_CONFIG, 32, 2, kernel_policy(CUDA).shared_memory)
        assert (stages - 1) * per_stage <= policy.shared_memory  # Triton keeps stages - 1 tiles
    assert not gluon.supported(torch.device("cpu"), 2880, 2880)


def test_pdl_switched_off_by_benchmarks_stays_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pdl, "ENABLED", False)
    with use_policy(decide((9, 0))):
        assert not pdl.pdl_launch(CUDA)
