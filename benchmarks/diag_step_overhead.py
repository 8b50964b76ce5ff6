"""Where a batch-1 decode step's time goes outside the decode CUDA graph (one GPU, random weights).

    python benchmarks/diag_step_overhead.py [--preset 20b]

Three timings of the same engine, CUDA events over many back-to-back iterations:
- graph: the batch-1 decode graph replayed alone (the decoder layers, no inputs copied);
- graph + head: the replay, then the final projection to logits and a greedy argmax, as the
  runner and sampler run them;
- step: the engine's own step (median TPOT of a 1024-token prompt's decode): the inputs copied
  in, the pending token written, the graph, the head, the sampler, the copy of the id to the host.
step - (graph + head) is what the step spends beside the model: copies, small kernels and gaps.
"""

from __future__ import annotations

import argparse
import time

import torch

from osserve.bench.latency import run_once
from osserve.engine.load import EngineArgs, build_engine


def per_iteration_us(fn, iterations: int = 300) -> float:  # type: ignore[no-untyped-def]
    for _ in range(10):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iterations):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / iterations


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="20b")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.90)
    args = ap.parse_args()
    engine = build_engine(EngineArgs(load_format="dummy", preset=args.preset, max_model_len=8192, max_num_seqs=64,
                                     max_num_batched_tokens=16384,
                                     gpu_memory_utilization=args.gpu_memory_utilization))
    run_once(engine, 1, 128, 16, seed=99)  # compile everything
    step = run_once(engine, 1, 1024, 512, seed=1)
    runner = engine.runner
    assert runner.graphs is not None
    graph, hidden = runner.graphs.graphs[1], runner.graphs.outputs[1][:1]
    model = runner.model
    graph_us = per_iteration_us(graph.replay)
    head_us = per_iteration_us(lambda: (graph.replay(), model.compute_logits(hidden).argmax(-1)))
    # The head's launch on the host alone (enqueued, not waited for): it must stay well below the
    # GPU's step for the step to stay GPU-bound.
    t0 = time.perf_counter()
    for _ in range(100):
        model.compute_logits(hidden)
    host_head_us = (time.perf_counter() - t0) * 1e4
    torch.cuda.synchronize()
    step_us = step.tpot_median_ms * 1000
    print(f"\n{torch.cuda.get_device_name()}, {args.preset}, batch 1")
    print(f"{'graph alone':>28} {graph_us:9.1f} us")
    print(f"{'graph + head + argmax':>28} {head_us:9.1f} us   (head + argmax {head_us - graph_us:.1f})")
    print(f"{'engine step (median TPOT)':>28} {step_us:9.1f} us   (beside the model {step_us - head_us:.1f})")
    print(f"{'head enqueue on the host':>28} {host_head_us:9.1f} us")


if __name__ == "__main__":
    main()
