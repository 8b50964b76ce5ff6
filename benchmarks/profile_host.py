"""Where a large decode step's host time goes: cProfile over engine.step() at serving batch sizes.

Run on the GPU: PYTHONPATH=$PWD python3 benchmarks/profile_host.py [--preset 20b] [--batch 229]
Builds the engine with random weights, fills the batch with short prompts, lets every request
reach decode, then times `--steps` calls of engine.step() (the GPU runs as it would in serving:
CUDA graphs, async scheduling) with the step profile the engine keeps, and profiles as many more:
the functions with the most own time and cumulative time.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import torch

from osserve.engine.engine import StepProfile
from osserve.engine.load import EngineArgs, build_engine
from osserve.engine.sampling_params import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="20b")
    ap.add_argument("--batch", type=int, default=229)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    engine = build_engine(EngineArgs(load_format="dummy", preset=args.preset, max_model_len=4096,
                                     max_num_seqs=256, max_num_batched_tokens=8192))
    g = torch.Generator().manual_seed(0)
    vocab = min(engine.model_config.vocab_size, 199_998)
    for i in range(args.batch):
        prompt = torch.randint(0, vocab, (args.prompt_len,), generator=g).tolist()
        engine.add_request(f"p{i}", prompt, SamplingParams(temperature=0.0, max_tokens=2 * args.steps + 40,
                                                           ignore_eos=True))
    for _ in range(20):  # prefills, then a few decode steps to warm the caches
        engine.step()
    engine.profile = StepProfile()  # count the measured steps only
    start = time.perf_counter()
    for _ in range(args.steps):
        engine.step()
    wall = time.perf_counter() - start
    print(f"{args.steps} steps at batch {args.batch}: {1000 * wall / args.steps:.2f} ms per step")
    print(engine.profile.summary())
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(args.steps):
        engine.step()
    profiler.disable()
    stats = pstats.Stats(profiler)
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
