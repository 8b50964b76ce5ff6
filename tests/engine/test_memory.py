"""The GPU memory plan's arithmetic (engine/memory.py) with a card's size and no card: the 20b on a
24 GB card at --gpu-memory-utilization 0.9 with a useful KV cache, the 120b refused on a card it
cannot fit with one line naming the shortfall, the workspace, and the experts' layouts kept or
dropped by the card's size."""

from __future__ import annotations

import re

import pytest
import torch

from osserve.config import CacheConfig, SchedulerConfig, preset
from osserve.engine.memory import (
    SIMULATED_GPU_ENV,
    DeviceMemory,
    GiB,
    capacity,
    checkpoint_bytes,
    expert_bytes,
    keep_checkpoint_experts,
    minimum_kv_bytes,
    plan_for_card,
    refuse_if_too_small,
    refuse_small_kv_budget,
    resident_weights,
    simulated_gpu_bytes,
    workspace_bytes,
)
from osserve.engine.worker.kv_tensors import allocate_kv_caches, plan_kv_cache
from osserve.errors import ConfigError
from osserve.ops.attention.kv_format import FP8_DTYPE

BF16 = torch.bfloat16
CONTEXT = GiB // 2  # a CUDA context and its modules before the model, about what PyTorch takes
A10 = DeviceMemory("NVIDIA A10", int(22.2 * GiB), CONTEXT)  # 24 GB with ECC on, as PyTorch reports it
RTX_4090 = DeviceMemory("NVIDIA GeForce RTX 4090", int(23.68 * GiB), CONTEXT)
L40S = DeviceMemory("NVIDIA L40S", int(44.4 * GiB), CONTEXT)
H100 = DeviceMemory("NVIDIA H100 80GB HBM3", int(79.1 * GiB), CONTEXT)
SERVE = SchedulerConfig(max_model_len=32768)  # `osserve serve`'s defaults on a GPU
AT_90 = CacheConfig(gpu_memory_utilization=0.90)


def test_the_weights_are_the_measured_ones() -> None:
    """The 120b's checkpoint as the H100's memory-plan line measured it (BENCHMARKS.md: 60.77 GiB)."""
    assert round(checkpoint_bytes(preset("120b"), BF16) / GiB, 2) == 60.77
    assert 12.7 < checkpoint_bytes(preset("20b"), BF16) / GiB < 12.9
    assert expert_bytes(preset("20b")) < checkpoint_bytes(preset("20b"), BF16)


def test_the_workspace_grows_with_the_step() -> None:
    assert workspace_bytes(8192) == 3 * GiB  # the default: what every H100 figure ran with
    assert workspace_bytes(2048) == int(1.5 * GiB)


@pytest.mark.parametrize("card", [A10, RTX_4090])
def test_the_20b_on_a_24_gb_card(card: DeviceMemory) -> None:
    cfg = preset("20b")
    refuse_if_too_small("openai/gpt-oss-20b", cfg, AT_90, SERVE, BF16, card)
    weights, plan = plan_for_card(cfg, AT_90, SERVE, BF16, card)
    assert not keep_checkpoint_experts(checkpoint_bytes(cfg, BF16), card.total)  # one layout of the experts
    assert weights < 13 * GiB and plan.total_bytes > 3.5 * GiB
    tokens = plan.max_tokens_per_request()
    assert tokens >= 3 * SERVE.max_model_len  # three requests at the full 32k context, 26 at 4k
    assert weights + plan.total_bytes + workspace_bytes(SERVE.max_num_batched_tokens) + card.in_use \
        <= AT_90.gpu_memory_utilization * card.total
    line = capacity(plan, SERVE.max_model_len)
    assert line == (f"KV cache: {tokens:,} tokens of context, enough for {tokens // 32768} requests of 32,768 tokens "
                    f"at once ({tokens // 8192} of 8,192, {tokens // 4096} of 4,096)")


def test_smaller_steps_leave_a_24_gb_card_more_cache() -> None:
    cfg = preset("20b")
    small = SchedulerConfig(max_model_len=32768, max_num_batched_tokens=2048)
    assert plan_for_card(cfg, AT_90, small, BF16, A10)[1].total_bytes - plan_for_card(
        cfg, AT_90, SERVE, BF16, A10)[1].total_bytes >= 1.4 * GiB


def test_the_full_context_of_the_20b_does_not_fit_a_24_gb_card() -> None:
    """131,072 tokens of full-attention KV (3 GiB) and 256 sliding windows (1.1 GiB) do not fit
    what the weights and the workspace leave: refused, with what to change."""
    long = SchedulerConfig(max_model_len=131072)
    with pytest.raises(ConfigError, match=r"short; try a smaller --max-model-len"):
        refuse_if_too_small("openai/gpt-oss-20b", preset("20b"), AT_90, long, BF16, A10)


@pytest.mark.parametrize("card", [A10, RTX_4090, L40S])
def test_the_120b_is_refused_where_it_cannot_fit(card: DeviceMemory) -> None:
    with pytest.raises(ConfigError) as refused:
        refuse_if_too_small("openai/gpt-oss-120b", preset("120b"), AT_90, SERVE, BF16, card)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"openai/gpt-oss-120b does not fit {card.name}")
    needed = float(message.split("it needs ")[1].split(" GiB")[0])
    available = float(message.split("leaves ")[1].split(" GiB")[0])
    short = float(re.search(r"([\d.]+) GiB short", message).group(1))  # type: ignore[union-attr]
    assert needed > 64 and available == pytest.approx(0.9 * card.total / GiB - 0.5, abs=0.01)
    assert short == pytest.approx(needed - available, abs=0.02)
    assert "larger GPU" in message


def test_the_120b_fits_an_h100() -> None:
    cfg = preset("120b")
    refuse_if_too_small("openai/gpt-oss-120b", cfg, AT_90, SERVE, BF16, H100)
    assert not keep_checkpoint_experts(checkpoint_bytes(cfg, BF16), H100.total)
    assert plan_for_card(cfg, AT_90, SERVE, BF16, H100)[1].max_tokens_per_request() >= SERVE.max_model_len


def test_the_20b_keeps_both_expert_layouts_only_on_a_large_card() -> None:
    cfg = preset("20b")
    assert resident_weights(cfg, BF16, H100.total) - resident_weights(cfg, BF16, A10.total) == expert_bytes(cfg)
    assert keep_checkpoint_experts(checkpoint_bytes(cfg, BF16), H100.total)
    assert keep_checkpoint_experts(checkpoint_bytes(cfg, BF16), L40S.total)


def test_a_measured_budget_below_the_smallest_cache_is_refused() -> None:
    cfg = preset("20b")
    need = minimum_kv_bytes(cfg, AT_90, SERVE, BF16)
    refuse_small_kv_budget(need, cfg, AT_90, SERVE, BF16)
    with pytest.raises(ConfigError, match=r"gets 0\.50 GiB .* GiB short"):
        refuse_small_kv_budget(GiB // 2, cfg, AT_90, SERVE, BF16)


def test_a_smaller_card_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SIMULATED_GPU_ENV, raising=False)
    assert simulated_gpu_bytes() is None
    monkeypatch.setenv(SIMULATED_GPU_ENV, "22.2")
    assert simulated_gpu_bytes() == int(22.2 * GiB)
    monkeypatch.setenv(SIMULATED_GPU_ENV, "24GB")
    with pytest.raises(ConfigError, match="expected GiB"):
        simulated_gpu_bytes()


H200 = DeviceMemory("NVIDIA H200", int(139.8 * GiB), CONTEXT)


@pytest.mark.parametrize("name", ["20b", "120b"])
@pytest.mark.parametrize("card,utilization", [(H100, 0.97), (H100, 0.90), (H200, 0.95)])
def test_an_fp8_cache_holds_1_9x_the_tokens_of_bf16_in_the_same_budget(name: str, card: DeviceMemory,
                                                                       utilization: float) -> None:
    """--kv-cache-dtype fp8: e4m3 codes and a bf16 scale per 64 (ops/attention/kv_format.py), in the
    budget bf16 gets: its full-attention tokens at least 1.9x bf16's (1.94x, and more: the sliding
    group keeps the blocks bf16 gave it, in half the bytes, and the rest goes to the full layers),
    and neither plan above the budget."""
    cfg, cache = preset(name), CacheConfig(gpu_memory_utilization=utilization)
    _, bf16 = plan_for_card(cfg, cache, SERVE, BF16, card)
    _, fp8 = plan_for_card(cfg, cache, SERVE, BF16, card, kv_dtype=FP8_DTYPE)
    assert fp8.max_tokens_per_request() >= 1.9 * bf16.max_tokens_per_request()
    budget = bf16.total_bytes + bf16.bytes_per_block["full"]  # the budget both were cut from, within a block
    assert fp8.total_bytes <= budget
    assert fp8.num_blocks["sliding"] == bf16.num_blocks["sliding"]


def test_the_120b_on_an_h100_at_0_97_holds_380k_fp8_tokens() -> None:
    """The issue's goal for the 120b's 1k/1k workload on one H100: a KV cache of >= 380k tokens."""
    _, plan = plan_for_card(preset("120b"), CacheConfig(gpu_memory_utilization=0.97), SERVE, BF16, H100, FP8_DTYPE)
    assert plan.max_tokens_per_request() >= 380_000


def test_an_fp8_cache_allocates_what_its_plan_counted() -> None:
    cfg = preset("tiny")
    cache = CacheConfig(num_blocks=None)
    plan = plan_kv_cache(cfg, cache, SchedulerConfig(max_num_seqs=4, max_model_len=512), 8 * 2**20, FP8_DTYPE)
    caches = allocate_kv_caches(cfg, plan, FP8_DTYPE, torch.device("cpu"))
    assert sum(t.numel() * t.element_size() for kv in caches for t in kv.tensors()) == plan.total_bytes
    bf16 = plan_kv_cache(cfg, cache, SchedulerConfig(max_num_seqs=4, max_model_len=512), 8 * 2**20, BF16)
    assert plan.max_tokens_per_request() >= 1.9 * bf16.max_tokens_per_request()
    assert minimum_kv_bytes(cfg, cache, SERVE, FP8_DTYPE) < 0.52 * minimum_kv_bytes(cfg, cache, SERVE, BF16)
