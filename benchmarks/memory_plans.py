"""The memory plan `osserve serve` would make on common GPUs, without them (engine/memory.py's
arithmetic, the figures load.py feeds it replaced by each card's size as PyTorch reports it and half a
GiB for the CUDA context). Runs on a CPU:

    PYTHONPATH=$PWD python3 benchmarks/memory_plans.py [--gpu-memory-utilization 0.9] [--max-model-len 32768]
        [--kv-cache-dtype fp8]
"""

from __future__ import annotations

import argparse

import torch

from osserve.config import CacheConfig, SchedulerConfig, preset
from osserve.engine.memory import (
    DeviceMemory,
    GiB,
    default_batched_tokens,
    plan_for_card,
    refuse_if_too_small,
    workspace_bytes,
)
from osserve.errors import ConfigError
from osserve.ops.attention.kv_format import FP8_DTYPE

CARDS = {  # GiB as torch.cuda.get_device_properties reports them (ECC on where the card has it)
    "A10 / A10G / L4 (24 GB)": 22.2,
    "RTX 3090 / 4090 (24 GB)": 23.68,
    "A100 40GB": 39.5,
    "L40S / A6000 (48 GB)": 44.4,
    "A100 80GB": 79.25,
    "H100 80GB": 79.1,
}
CONTEXT_GIB = 0.5


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.90)
    ap.add_argument("--max-model-len", type=int, default=32768)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=None,
                    help="default: each card's, as `osserve serve` picks it (engine/memory.py)")
    ap.add_argument("--kv-cache-dtype", choices=("auto", "fp8"), default="auto")
    args = ap.parse_args()
    kv_dtype = FP8_DTYPE if args.kv_cache_dtype == "fp8" else torch.bfloat16
    cache = CacheConfig(gpu_memory_utilization=args.gpu_memory_utilization)
    print(f"--gpu-memory-utilization {cache.gpu_memory_utilization}, --max-model-len {args.max_model_len}, "
          f"--max-num-seqs {args.max_num_seqs}, {CONTEXT_GIB} GiB in use before the model, "
          f"--kv-cache-dtype {args.kv_cache_dtype}\n")
    print(f"| {'GPU':<26} | model | weights GiB | step tokens (workspace GiB) | KV cache GiB | context tokens | "
          f"requests of {args.max_model_len:,} / 8,192 / 4,096 at once |")
    print("|---|---|---|---|---|---|---|")
    for card, gib in CARDS.items():
        device = DeviceMemory(card, int(gib * GiB), int(CONTEXT_GIB * GiB))
        for name in ("20b", "120b"):
            cfg = preset(name)
            budget = args.max_num_batched_tokens or default_batched_tokens(cfg, cache, torch.bfloat16, device.total)
            sched = SchedulerConfig(max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                                    max_num_batched_tokens=budget)
            step = f"{budget:,} ({workspace_bytes(budget) / GiB:.2f})"
            try:
                refuse_if_too_small(f"gpt-oss-{name}", cfg, cache, sched, torch.bfloat16, device, kv_dtype)
            except ConfigError as e:
                short = str(e).split(": ")[-1].split(";")[0]
                print(f"| {card:<26} | {name} | refused: {short} | | | | |")
                continue
            weights, plan = plan_for_card(cfg, cache, sched, torch.bfloat16, device, kv_dtype)
            tokens = plan.max_tokens_per_request()
            print(f"| {card:<26} | {name} | {weights / GiB:.2f} | {step} | {plan.total_bytes / GiB:.2f} | {tokens:,} | "
                  f"{tokens // sched.max_model_len} / {tokens // 8192} / {tokens // 4096} |")


if __name__ == "__main__":
    main()
