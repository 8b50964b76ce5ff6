"""The serving workload without HTTP: where an engine step's GPU time goes at 256 streams.

On the GPU:  PYTHONPATH=$PWD python3 benchmarks/profile_serving.py --preset 120b --max-tokens 128 \
                 --gpu-memory-utilization 0.97

Runs issue 7's chat workload inside one process, closed loop: `--concurrency` requests live at
once, each the server's rendering of the same chat prompt (so after the first, the prompt comes
from the prefix cache, as in the served benchmark), temperature 1 and the server's stop ids,
`ignore_eos`, `--max-tokens` out; a finished request is replaced at once. Prints:
1. the engine's own throughput over `--num-requests` (the ceiling the HTTP server can reach) and
   its step profile (host phases);
   Slow steps are listed with what they computed: a wave of admissions shows as a step with
   many prompt tokens.
2. the GPU's kernels over `--profile-steps` steady-state steps (PyTorch profiler; the CUDA graphs
   replay as in serving), grouped, in ms per step, against the steps' wall time: how busy the GPU
   is, and which kernels besides the MoE fill its step.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections import defaultdict

import torch

from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.engine import LLMEngine
from osserve.engine.load import EngineArgs, build_engine
from osserve.engine.step_profile import StepProfile
from osserve.harmony.render import ChatMessage, render_chat
from osserve.server.generation import sampling_params

PROMPT = "Explain quantum mechanics in one paragraph."


def serving_engine(preset: str, gpu_memory_utilization: float) -> LLMEngine:
    """The engine as benchmarks/serve_bench.sh starts the server's (random weights; warmed up on a GPU)."""
    return build_engine(EngineArgs(load_format="dummy", preset=preset, max_model_len=4096, max_num_seqs=256,
                                   max_num_batched_tokens=8192, gpu_memory_utilization=gpu_memory_utilization))


def chat_prompt() -> list[int]:
    """The server's rendering of the benchmark's chat message."""
    return render_chat([ChatMessage(role="user", content=PROMPT)]).token_ids


def server_params(max_tokens: int) -> SamplingParams:
    """What the server makes of the load generator's request: its defaults (temperature 1, its stop
    ids), max_tokens and ignore_eos."""
    return sampling_params(temperature=None, top_p=None, max_tokens=max_tokens, seed=None,
                           extra={"ignore_eos": True})


class ClosedLoop:
    """Keeps `concurrency` requests live until `total` have been started."""

    def __init__(self, engine: LLMEngine, concurrency: int, total: int, max_tokens: int) -> None:
        self.engine, self.concurrency, self.total, self.max_tokens = engine, concurrency, total, max_tokens
        self.prompt = chat_prompt()
        self.started = self.finished = self.output_tokens = 0

    def top_up(self) -> None:
        while self.started - self.finished < self.concurrency and self.started < self.total:
            self.engine.add_request(f"r{self.started}", list(self.prompt), server_params(self.max_tokens))
            self.started += 1

    def step(self) -> None:
        self.top_up()
        for d in self.engine.step():
            self.output_tokens += len(d.new_token_ids)
            self.finished += d.finished

    def done(self) -> bool:
        return self.finished >= self.total


def run_workload(engine: LLMEngine, args: argparse.Namespace) -> None:
    loop = ClosedLoop(engine, args.concurrency, args.num_requests, args.max_tokens)
    engine.profile = StepProfile()
    steps: list[tuple[float, int, int]] = []  # (ms, prompt tokens computed, requests started) per step
    outputs: list[int] = []  # output tokens per step
    first_finish = last_start = 0  # step indexes where the closed loop's phases change
    start = time.perf_counter()
    while not loop.done():
        t0, prompt, started, out = time.perf_counter(), engine.prompt_tokens_total, loop.started, loop.output_tokens
        loop.step()
        steps.append((1000 * (time.perf_counter() - t0), engine.prompt_tokens_total - prompt, loop.started - started))
        outputs.append(loop.output_tokens - out)
        first_finish = first_finish or (len(steps) if loop.finished else 0)
        last_start = last_start or (len(steps) if loop.started >= loop.total else 0)
    wall = time.perf_counter() - start
    print(f"engine alone: {args.num_requests} requests, {loop.output_tokens} output tokens in {wall:.2f} s: "
          f"{loop.output_tokens / wall:,.1f} output tok/s, {args.num_requests / wall:.2f} req/s")
    print("| phase | steps | s | ms a step | output tokens a step |\n|---|---|---|---|---|")
    for phase, lo, hi in (("until the first request ends", 0, first_finish),
                          ("replacing ended requests", first_finish, last_start), ("drain", last_start, len(steps))):
        ms, n = sum(s[0] for s in steps[lo:hi]), max(1, hi - lo)
        print(f"| {phase} | {hi - lo} | {ms / 1000:.2f} | {ms / n:.2f} | {sum(outputs[lo:hi]) / n:.1f} |")
    print(f"step profile: {engine.profile.summary()}")
    slow = sorted(range(len(steps)), key=lambda i: -steps[i][0])[:10]
    print("slowest steps (index: ms, prompt tokens computed, requests added): "
          + "; ".join(f"{i}: {steps[i][0]:.1f}, {steps[i][1]}, {steps[i][2]}" for i in sorted(slow)), flush=True)


def kernel_group(name: str) -> str:
    n = name.lower()
    for group, keys in (("moe gate/up", ("gate_up",)), ("moe down", ("_down",)),
                        ("moe plan/align", ("align", "plan", "histogram", "sort")),
                        ("router", ("router",)), ("attention", ("attn", "attention", "decode", "merge")),
                        ("rope/kv write", ("rope", "write_kv", "kv_cache")), ("norm", ("norm",)),
                        ("sampler", ("exponential", "argmax", "softmax", "div", "distribution", "max_")),
                        ("gemm", ("gemm", "matmul", "cublas", "sm90", "linear", "cutlass", "nvjet")),
                        ("copy", ("copy", "memcpy", "memset", "fill", "index", "gather", "scatter"))):
        if any(k in n for k in keys):
            return group
    return "other"


def profile_steps(engine: LLMEngine, args: argparse.Namespace) -> None:
    loop = ClosedLoop(engine, args.concurrency, 10**9, args.max_tokens)
    for _ in range(args.warmup_steps):  # reach the steady state: requests at every stage of their output
        loop.step()
    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    engine.profile = StepProfile()
    activity = torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU
    with torch.profiler.profile(activities=[activity]) as prof:
        start = time.perf_counter()
        for _ in range(args.profile_steps):
            loop.step()
        sync()
        wall = time.perf_counter() - start
    steps = args.profile_steps
    print(f"profiled {steps} steps: {1000 * wall / steps:.2f} ms a step (wall, profiler on); "
          f"{engine.profile.summary()}")
    kernels = [(ev.device_time_total if cuda else ev.self_cpu_time_total, ev.count, ev.key)
               for ev in prof.key_averages()]
    kernels = [k for k in kernels if k[0]]
    total_ms = sum(k[0] for k in kernels) / 1000 / steps
    groups: dict[str, float] = defaultdict(float)
    for us, _, name in kernels:
        groups[kernel_group(name)] += us / 1000 / steps
    what = "GPU kernels" if cuda else "CPU ops (self time)"
    print(f"{what}: {total_ms:.2f} ms a step ({100 * total_ms / (1000 * wall / steps):.0f}% of the wall)")
    print("top kernels (ms a step, launches a step, name):")
    for us, count, name in sorted(kernels, reverse=True)[:args.top]:
        print(f"  {us / 1000 / steps:8.3f} {count / steps:7.1f}  {name[:110]}")
    print("\n| group | ms a step | share |\n|---|---|---|")
    for group, ms in sorted(groups.items(), key=lambda g: -g[1]):
        print(f"| {group} | {ms:.2f} | {100 * ms / total_ms:.0f}% |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="20b")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--num-requests", type=int, default=1000)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.90)
    ap.add_argument("--warmup-steps", type=int, default=300)
    ap.add_argument("--profile-steps", type=int, default=30)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--skip", default="", help="comma list of: workload,profile")
    args = ap.parse_args()
    engine = serving_engine(args.preset, args.gpu_memory_utilization)
    gc.collect()  # build_engine has run warm_up (on a GPU)
    gc.freeze()  # as the server's engine process does: full collections would not skip the model's objects
    if "workload" not in args.skip:
        run_workload(engine, args)
    if "profile" not in args.skip:
        profile_steps(engine, args)


if __name__ == "__main__":
    main()
