"""The cost of structured outputs on the engine (one GPU, random weights of the real shapes): batch
1 and batch 32 decode with every request's answer bound to a JSON schema, against the same
batches unconstrained, alternating in one process (same engine, same machine).

    python benchmarks/bench_structured.py [--preset 20b] [--rounds 2]

With `ignore_eos`, each constrained request reasons freely (the grammar's share: half of
max_tokens), writes its JSON answer, then its grammar allows only the stop token: every step of
every request fills and applies a token mask. Table printed last.
"""

from __future__ import annotations

import argparse
import json
import logging

import torch

from osserve.bench.latency import run_once
from osserve.engine.load import EngineArgs, build_engine

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["answer", "unit", "confidence", "steps"],
          "properties": {"answer": {"type": "integer"}, "unit": {"enum": ["km", "mi", "m"]},
                         "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                         "steps": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 3}}}


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="20b")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--input-len", type=int, default=1024)
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default=None, help="cpu: a dry run of the script (tiny preset)")
    args = ap.parse_args()
    engine = build_engine(EngineArgs(load_format="dummy", preset=args.preset, max_model_len=8192, max_num_seqs=64,
                                     max_num_batched_tokens=16384, gpu_memory_utilization=0.90, device=args.device))
    for schema in (None, SCHEMA):  # compile every kernel, the grammar's vocabulary and schema too
        run_once(engine, 32, 128, 16, seed=99, json_schema=schema)
    rows = []
    for batch in (1, 32):
        for r in range(args.rounds):
            for label, schema in (("plain", None), ("json_schema", SCHEMA)):
                res = run_once(engine, batch, args.input_len, args.output_len, seed=r, json_schema=schema)
                if res.decode_tok_s == 0:  # every request ended at once: its grammar failed to build
                    raise SystemExit(f"{label} at batch {batch} produced no tokens: see the log")
                rows.append({"batch": batch, "round": r, "run": label, **vars(res)})
                print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    print(f"\n{device}  {args.preset}, prompt {args.input_len}, {args.output_len} out, greedy")
    print(f"{'batch':>5} {'round':>5} {'run':>12} {'decode tok/s':>12} {'TPOT p50 ms':>11} {'TPOT p90 ms':>11}")
    for row in rows:
        print(f"{row['batch']:>5} {row['round']:>5} {row['run']:>12} {row['decode_tok_s']:>12.1f} "
              f"{row['tpot_median_ms']:>11.3f} {row['tpot_p90_ms']:>11.3f}")


if __name__ == "__main__":
    main()
