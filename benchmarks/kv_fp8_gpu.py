"""--kv-cache-dtype fp8 on the GPU, the offline half of benchmarks/kv_fp8_gpu.sh: accuracy first, then
the attention kernels' timings, bf16 and FP8 caches side by side (the same process, the same card).

accuracy: the dummy model of PRESET (random weights of the real shapes), its decode logits over many
  steps with an FP8 cache against the same weights with a bf16 cache: 6 prompts (5-300 tokens) in one
  batch, 64 decode steps teacher-forced along the bf16 run's greedy tokens, through the fast kernels
  (Triton attention, split-KV decode). Relative logit error per step (median, p99) and the share of
  steps with the same argmax. One model serves both caches (the 120b's float32 reference would not
  fit a card: tests/gpu/test_kv_fp8_gpu.py bounds the 20b against float32). Random weights of these
  shapes are ill-conditioned (BENCHMARKS.md: the bf16 path alone is ~60% off float32 at the dummy
  20b's logits), so expect a large figure here: it is the FP8 cache's rounding, amplified as bf16's
  is; the trained demo model and the tiny checkpoint (CPU, benchmarks/kv_fp8_accuracy.py) show the
  format's own cost.
kernels: paged attention at gpt-oss's shapes, decode (CUDA-graph replays) at batch 1 / 32 / 128 / 256
  and 1k / 2k / 8k contexts, full and sliding, and prefill 8 x 2048: microseconds, bf16 vs FP8.

    PYTHONPATH=. python3 benchmarks/kv_fp8_gpu.py [--preset 20b|120b] [--skip-accuracy] [--skip-kernels] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import triton

from benchmarks.bench_attention import WINDOW, time_case
from osserve.ops.attention.kv_format import FP8_DTYPE

LENGTHS = (5, 130, 300, 17, 260, 64)


def accuracy(preset: str, steps: int = 64) -> dict[str, float]:
    from osserve.engine.load import EngineArgs, build_engine
    from tests.model.contiguous import ContiguousCache

    engine = build_engine(EngineArgs(load_format="dummy", preset=preset, max_model_len=4096, max_num_seqs=16,
                                     kv_cache_gb=1, enforce_eager=True))
    model = engine.runner.model
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 199_000, (n,), generator=g).tolist() for n in LENGTHS]

    def decode(kv_dtype: torch.dtype | None, forced: list[list[int]] | None) -> tuple[torch.Tensor, list[list[int]]]:
        cache = ContiguousCache(model, len(prompts), max(LENGTHS) + steps + 1, kv_dtype=kv_dtype)
        chunks, fed, out = [list(p) for p in prompts], [[] for _ in prompts], []
        with torch.inference_mode():
            for step in range(steps):
                ids, pos, meta = cache.step(list(range(len(prompts))), chunks)
                hidden = model(ids, pos, meta, cache.kv)
                logits = model.compute_logits(hidden[meta.query_start_loc[1:].long() - 1]).float()
                out.append(logits)
                nxt = [f[step] for f in forced] if forced is not None else logits.argmax(-1).tolist()
                for f, t in zip(fed, nxt, strict=True):
                    f.append(t)
                chunks = [[t] for t in nxt]
        return torch.stack(out, 1).flatten(0, 1), fed

    ref, greedy = decode(None, None)
    fp8, _ = decode(FP8_DTYPE, greedy)
    err = (fp8 - ref).norm(dim=1) / ref.norm(dim=1)
    return {"median": err.median().item(), "p99": err.quantile(0.99).item(),
            "same_argmax": (fp8.argmax(-1) == ref.argmax(-1)).float().mean().item()}


def kernels() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for batch in (1, 32, 128, 256):
        for ctx in (1024, 2048, 8192):
            if batch * ctx > 256 * 2048 * 2:
                continue
            for window in (None, WINDOW):
                seqs = [(ctx, 1)] * batch
                bf16, fp8 = (time_case(seqs, window, True, fp8=f) * 1e3 for f in (False, True))
                rows.append({"kind": "decode", "batch": batch, "ctx": ctx, "layer": "sliding" if window else "full",
                             "bf16_us": bf16, "fp8_us": fp8})
    for window in (None, WINDOW):
        seqs = [(2048, 2048)] * 8
        bf16, fp8 = (time_case(seqs, window, False, fp8=f) * 1e3 for f in (False, True))
        rows.append({"kind": "prefill", "batch": 8, "ctx": 2048, "layer": "sliding" if window else "full",
                     "bf16_us": bf16, "fp8_us": fp8})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="20b", choices=("tiny", "20b", "120b"))
    ap.add_argument("--skip-accuracy", action="store_true")
    ap.add_argument("--skip-kernels", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    result: dict[str, object] = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d")}
    if not args.skip_accuracy:
        acc = accuracy(args.preset)
        result["accuracy"] = acc
        print(f"accuracy, dummy {args.preset}, FP8 vs bf16 KV over {len(LENGTHS)} x 64 decode steps: relative logit "
              f"error median {acc['median']:.4f}, p99 {acc['p99']:.4f}; same argmax {acc['same_argmax']:.3f}")
    rows = [] if args.skip_kernels else kernels()
    result["kernels"] = rows
    print("\n| attention | batch | context | layer | bf16 us | fp8 us | fp8 / bf16 |\n|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['kind']} | {r['batch']} | {r['ctx']} | {r['layer']} | {r['bf16_us']:.1f} | {r['fp8_us']:.1f} | "
              f"{float(r['fp8_us']) / float(r['bf16_us']):.2f} |")  # type: ignore[arg-type]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
