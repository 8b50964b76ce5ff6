"""Where a large decode step's host time goes: cProfile over engine.step() at serving batch sizes.

On the GPU:   PYTHONPATH=$PWD python3 benchmarks/profile_host.py [--preset 20b] [--batch 229]
On any CPU:   PYTHONPATH=$PWD python3 benchmarks/profile_host.py --host-only [--batch 229]

Builds the engine with random weights, fills the batch with short prompts (greedy, ignore_eos;
the serving benchmark samples at temperature 1, which adds device work and one per-row tensor),
lets every request reach decode, then times `--steps` calls of
engine.step() (the GPU runs as it would in serving: CUDA graphs, async scheduling) with the step
profile the engine keeps, and profiles as many more: the functions with the most own time and
cumulative time. --host-only runs the tiny preset on CPU with the model's work stubbed out
(benchmarks/host_stub.py), so what is timed is the host path alone, and adds the cost of the
message the engine process pickles for the server after each step. Contexts grow by one token a
step (64 + 20 warm-up steps, then --rounds x --steps more), and the host's work a little with them.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import time

import torch

from benchmarks.host_stub import build_host_only_engine, process_step_message
from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.engine import LLMEngine
from osserve.engine.load import EngineArgs, build_engine
from osserve.engine.step_profile import StepProfile


def fill(engine: LLMEngine, batch: int, prompt_len: int, max_tokens: int) -> None:
    g = torch.Generator().manual_seed(0)
    vocab = min(engine.model_config.vocab_size, 199_998)
    for i in range(batch):
        prompt = torch.randint(0, vocab, (prompt_len,), generator=g).tolist()
        engine.add_request(f"p{i}", prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))


class GcTimer:
    """Time spent in the garbage collector (a host cost cProfile does not show by name)."""

    def __init__(self) -> None:
        self.seconds, self.collections, self._start = 0.0, [0, 0, 0], 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start
            self.collections[info["generation"]] += 1

    def close(self) -> None:
        gc.callbacks.remove(self._on_gc)


def timed_steps(engine: LLMEngine, steps: int, host_only: bool) -> None:
    engine.profile = StepProfile()  # count the measured steps only
    stats = dumps = loads = 0.0
    size = 0
    gc_timer = GcTimer()
    start = time.perf_counter()
    for _ in range(steps):
        deltas = engine.step()
        if host_only:
            s, d, lo, size = process_step_message(engine, deltas)
            stats, dumps, loads = stats + s, dumps + d, loads + lo
    wall = time.perf_counter() - start
    gc_timer.close()
    batch = engine.profile.requests / max(engine.profile.steps, 1)
    print(f"{steps} steps at batch {batch:.0f}: {1000 * wall / steps:.2f} ms per step "
          f"(garbage collector {1000 * gc_timer.seconds / steps:.2f} ms per step, collections by generation "
          f"{gc_timer.collections})")
    print(engine.profile.summary())
    if host_only:
        print(f"process loop, ms per step: stats {1000 * stats / steps:.3f}, pickle {1000 * dumps / steps:.2f} "
              f"({size} bytes), unpickle in the server {1000 * loads / steps:.2f}")


def profile(engine: LLMEngine, steps: int, host_only: bool, top: int) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        deltas = engine.step()
        if host_only:
            process_step_message(engine, deltas)
    profiler.disable()
    stats = pstats.Stats(profiler)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="20b")
    ap.add_argument("--host-only", action="store_true", help="tiny preset on CPU, model work stubbed out")
    ap.add_argument("--batch", type=int, default=229)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds of --steps steps (host noise: take the best)")
    ap.add_argument("--top", type=int, default=30, help="functions to list from a cProfile pass (0: no pass)")
    args = ap.parse_args()
    if args.host_only:
        engine = build_host_only_engine(max_num_seqs=256)
    else:
        engine = build_engine(EngineArgs(load_format="dummy", preset=args.preset, max_model_len=4096,
                                         max_num_seqs=256, max_num_batched_tokens=8192))
    fill(engine, args.batch, args.prompt_len, (args.rounds + 1) * args.steps + 40)
    for _ in range(20):  # prefills, then a few decode steps to warm the caches
        engine.step()
    for _ in range(args.rounds):
        timed_steps(engine, args.steps, args.host_only)
    if args.top > 0:
        profile(engine, args.steps, args.host_only, args.top)
    gc.unfreeze()  # build_host_only_engine froze the startup objects; exit collects them


if __name__ == "__main__":
    main()
