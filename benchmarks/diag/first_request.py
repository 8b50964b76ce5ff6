"""How long the first requests after start-up take (compiles that warm-up did not cover show here).

    PYTHONPATH=$PWD python3 benchmarks/diag/first_request.py --preset 120b
"""

from __future__ import annotations

import argparse
import time

import torch
import triton

from benchmarks.profile_serving import chat_prompt, server_params, serving_engine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="120b")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.97)
    args = ap.parse_args()
    engine = serving_engine(args.preset, args.gpu_memory_utilization)
    # build_engine has run warm_up (on a GPU): from here on, every compile is one warm-up missed.

    def report(**kw) -> None:  # type: ignore[no-untyped-def]
        print(f"  not compiled by warm-up: {kw['repr'][:240]}", flush=True)

    triton.knobs.runtime.jit_post_compile_hook = report
    prompt = chat_prompt()
    n = 0
    for group in (1, 1, 7, 40, 130, 1):
        start = time.perf_counter()
        for _ in range(group):
            engine.add_request(f"r{n}", list(prompt), server_params(4))
            n += 1
        steps = []
        first = None
        while engine.has_unfinished():
            t0 = time.perf_counter()
            deltas = engine.step()
            torch.cuda.synchronize()
            steps.append(round(1000 * (time.perf_counter() - t0), 1))
            if first is None and any(d.new_token_ids for d in deltas):
                first = time.perf_counter() - start
        print(f"{group} requests: first token after {1000 * (first or 0):.1f} ms; steps ms {steps}", flush=True)


if __name__ == "__main__":
    main()
