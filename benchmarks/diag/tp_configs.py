"""Which engine setting makes two layouts' greedy outputs part (2 x H200, 2026-11-26: tp_bench.py's
TP 2 rows matched TP 1 in no prompt, logits 55% (20b) and 105% (120b) apart, while
tests/gpu/test_tp_gpu.py's TP 2 engines, with a 2 GiB cache, matched the float32 reference).
Builds one engine per variant, in order, and compares each with the first: tp_bench.py's 8 prompts
decoded greedily in one batch, then each alone forced to the first variant's tokens.

    python3 benchmarks/diag/tp_configs.py --preset 20b \
        --variants "tp=1,kv=2" "tp=1" "tp=2,kv=2" "tp=2" "tp=2,batched=8192"

A variant: comma list of tp=N, kv=GiB (kv_cache_gb; else gpu_memory_utilization 0.90),
batched=N (max_num_batched_tokens), eager (enforce_eager), nomixed (no_mixed_graphs).

Found (1b99bac): only the layout parts them; each layout's tokens are the same over the cache
sizes and step budgets (history file, "Tensor parallelism on 2 GPUs").
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial

import torch

from benchmarks.tp_bench import compare, forced_logits, greedy_batch, prompts, with_engine
from osserve.engine.engine import LLMEngine
from osserve.engine.load import EngineArgs


def engine_args(preset: str, variant: str) -> EngineArgs:
    kw: dict[str, object] = {"load_format": "dummy", "preset": preset, "max_model_len": 4096, "max_num_seqs": 64,
                             "gpu_memory_utilization": 0.90}
    for part in filter(None, variant.split(",")):
        key, _, value = part.partition("=")
        if key == "tp":
            kw["tensor_parallel_size"] = int(value)
        elif key == "kv":
            kw["kv_cache_gb"] = float(value)
        elif key == "batched":
            kw["max_num_batched_tokens"] = int(value)
        elif key == "eager":
            kw["enforce_eager"] = True
        elif key == "nomixed":
            kw["no_mixed_graphs"] = True
        else:
            raise SystemExit(f"unknown variant part {part!r}")
    return EngineArgs(**kw)  # type: ignore[arg-type]


def decode(engine: LLMEngine, ps: list[list[int]], forced: list[list[int]] | None
           ) -> tuple[list[list[int]], torch.Tensor]:
    """The prompts' greedy tokens in one batch, and each prompt's logits alone, forced to `forced`
    (None: those tokens)."""
    tokens = greedy_batch(engine, ps)
    return tokens, forced_logits(engine, ps, forced if forced is not None else tokens)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="20b")
    ap.add_argument("--variants", nargs="+", required=True)
    args = ap.parse_args()
    ps = prompts()
    ref: tuple[list[list[int]], torch.Tensor] | None = None
    for variant in args.variants:
        start = time.perf_counter()
        tokens, logits = with_engine(engine_args(args.preset, variant),
                                     partial(decode, ps=ps, forced=ref[0] if ref is not None else None))
        ref = ref or (tokens, logits)
        row = {"preset": args.preset, "variant": variant, **compare(tokens, logits, *ref),
               "first_tokens": [t[0] for t in tokens], "s": round(time.perf_counter() - start, 1)}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
