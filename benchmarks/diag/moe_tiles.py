"""Diagnostic: the Gluon MoE at serving batch sizes, by token tile, gate/up tiles a program, ring depth,
ragged tiles and register caps.

At T=256 the 20b's 32 experts get 32 slots each on average and the default token tile is 32, so an
expert with more than 32 slots runs a second, mostly empty tile and dequantises its weights twice
(ragged tiles, gluon.py's RAGGED, run such a tile at half its rows). This times the alternatives
(uniform routing, as bench_moe_gluon.py), checks each against the float32 reference, and counts the
token tiles each tile size makes. Run on the GPU:
PYTHONPATH=$PWD python3 benchmarks/diag/moe_tiles.py [--tokens ...] [--variants ...]
"""

from __future__ import annotations

import argparse
from functools import partial

import torch

from benchmarks.bench_moe import EXPERT_BYTES, graph_time_us
from benchmarks.bench_moe_decode import HIDDEN, INTER, LIMIT, MODELS, kernel_times, rel_err, timing_inputs
from osserve.ops.moe.gluon import fused_moe_gluon
from osserve.ops.moe.layout import prepare_mxfp4_experts
from osserve.ops.moe.reference import moe_reference
from tests.ops.moe_fixtures import random_experts


def token_tiles(ids: torch.Tensor, num_experts: int, bt: int) -> int:
    counts = torch.bincount(ids.reshape(-1), minlength=num_experts)
    return int(((counts + bt - 1) // bt).sum())


def variant(spec: str) -> tuple[str, dict]:
    """"bt:tiles:stages[:r][:w][:gN][:dN][:xN]" -> (its column name, fused_moe_gluon's keyword arguments)."""
    bt, tiles, stages, *flags = spec.split(":")
    caps = {f[0]: int(f[1:]) for f in flags if f[0] in "gd"}
    kwargs = {"block_t": int(bt), "gate_up_tiles": int(tiles), "stages": int(stages), "ragged": "r" in flags}
    if "w" in flags:
        kwargs["ws"] = True
    for flag in (f for f in flags if f[0] == "x"):
        kwargs["down_tiles"] = int(flag[1:])
    if caps:
        kwargs["max_registers"] = (caps.get("g"), caps.get("d"))
    return f"bt{bt} x{tiles} st{stages}" + "".join(f" {f}" for f in flags), kwargs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", default="20b:128,192,256,320,384;120b:256,384,512")
    parser.add_argument("--variants", default="16:1:4,32:1:3,32:2:3,64:1:3,64:2:3,64:1:2,32:2:4",
                        help="token tile:gate/up tiles:ring depth, then optionally :r (ragged tiles: gluon.py's "
                             "RAGGED), :w (the copy-warp K loop, moe/gluon_ws.py), :gN / :dN (gate/up / down "
                             "register caps), :xN (down tiles a program), comma separated")
    parser.add_argument("--kernels", action="store_true",
                        help="also each kernel's µs a layer (torch.profiler, eager launches), for every variant")
    args = parser.parse_args()
    variants = [variant(v) for v in args.variants.split(",")]
    props = torch.cuda.get_device_properties(0)
    print(f"GPU {props.name}, {props.multi_processor_count} SMs; torch {torch.__version__}", flush=True)
    rows = []
    for spec in args.tokens.split(";"):
        model, ts = spec.split(":")
        num_experts, layers = MODELS[model]
        torch.manual_seed(0)
        originals = [random_experts(num_experts, HIDDEN, INTER, device="cuda") for _ in range(layers)]
        gluon = [prepare_mxfp4_experts(e, fragments=True) for e in originals]
        for t in (int(v) for v in ts.split(",")):
            x, w, ids, hit = timing_inputs(t, num_experts)
            ref = moe_reference(x.float(), w.float(), ids, originals[0], LIMIT)
            times = {"default": graph_time_us([partial(fused_moe_gluon, x, w, ids, p, LIMIT) for p in gluon])}
            for name, kwargs in variants:
                run = partial(fused_moe_gluon, **kwargs)
                err = rel_err(run(x, w, ids, gluon[0], LIMIT), ref)
                assert err < 1e-2, (model, t, name, err)
                times[name] = graph_time_us([partial(run, x, w, ids, p, LIMIT) for p in gluon])
            # Timed again last: the first timing of a row ran 2-4% under its explicit twin (2026-11-26).
            times["default again"] = graph_time_us([partial(fused_moe_gluon, x, w, ids, p, LIMIT) for p in gluon])
            if args.kernels:
                for name, kwargs in [("default", {}), *variants]:
                    parts = kernel_times([partial(fused_moe_gluon, x, w, ids, gluon[0], LIMIT, **kwargs)], rounds=10)
                    print(f"kernels {model} T={t} {name}: "
                          + ", ".join(f"{k} {v:.1f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])),
                          flush=True)
            counts = {bt: token_tiles(ids, num_experts, bt) for bt in (16, 32, 64)}
            print(f"time {model} T={t}: tiles {counts}; " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()),
                  flush=True)
            rows.append((model, t, hit, counts, times))
        originals = gluon = []
        torch.cuda.empty_cache()
    names = list(rows[0][4])
    print("\nmodel     T  tiles16/32/64  " + "  ".join(f"{n:>14}" for n in names) + "   (us a layer; default TB/s)")
    for model, t, hit, counts, times in rows:
        tbs = hit * EXPERT_BYTES / (times["default"] * 1e-6) / 1e12
        print(f"{model:>5} {t:5d}  {counts[16]:4d}/{counts[32]:3d}/{counts[64]:3d}  "
              + "  ".join(f"{times[n]:14.1f}" for n in names) + f"   {tbs:.2f}")


if __name__ == "__main__":
    main()
