"""Where a batch-1 decode step's time goes outside the decode CUDA graph (one GPU, random weights).

    python benchmarks/diag/step_overhead.py [--preset 20b]

Timings of the same engine, CUDA events over many back-to-back iterations:
- the decoder layers captured as a graph of their own (no inputs copied);
- that graph, then the final projection to logits, the cast to float32 and torch's argmax, run
  eagerly (the step before ops/linear/head_triton.py);
- that graph, then the fused head (logits and greedy ids, ops/linear/head_triton.py), eagerly;
- the engine's batch-1 decode graph, which takes the fused head inside (engine/worker/cuda_graphs.py);
- the engine's own step (median TPOT of a 1024-token prompt's decode): the inputs copied in, the
  graph, the sampler, the event the engine waits on before it reads the id.
step - engine graph is what the step spends beside the model: copies, small kernels and gaps.
Then the engine graph again with the step's own operations added one at a time, as the engine
issues them: the staged inputs' host-to-device copy (the pending token is read inside the graph,
and the head writes the sampled id to pinned host memory itself: engine/worker/cuda_graphs.py) and the
event the engine waits on; and, for comparison, the step with the two copies the steps before
made: the pending token into the input ids before the graph, the sampled id to the host after.
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import numpy as np
import torch

from osserve.bench.latency import run_once
from osserve.engine.load import EngineArgs, build_engine
from osserve.engine.worker.cuda_graphs import capture_graph
from osserve.engine.worker.staged_inputs import NO_SLOT


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
    graphs = runner.graphs
    assert graphs is not None and graphs.outputs[1].logits is not None
    model = runner.model
    # The decoder layers alone as a graph of their own (the engine's batch-1 graph takes the head).
    # The engine's last steps left their input id pending (-1: read inside its graph): give one.
    graphs.input_ids.zero_()
    layers, hidden = capture_graph(partial(model, graphs.input_ids[:1], graphs.positions[:1], graphs._meta(1),
                                           runner.kv_caches), None)
    layers_us = per_iteration_us(layers.replay)
    eager_us = per_iteration_us(lambda: (layers.replay(), model.compute_logits(hidden).argmax(-1)))
    fused_us = per_iteration_us(lambda: (layers.replay(), model.compute_logits_and_greedy(hidden)))
    engine_graph_us = per_iteration_us(graphs.graphs[1].replay)
    # The head's launch on the host alone (enqueued, not waited for): it must stay well below the
    # GPU's step for the step to stay GPU-bound.
    t0 = time.perf_counter()
    for _ in range(100):
        model.compute_logits(hidden)
    host_head_us = (time.perf_counter() - t0) * 1e4
    torch.cuda.synchronize()
    step_us = step.tpot_median_ms * 1000
    out = graphs.outputs[1]
    assert out.greedy is not None
    position = np.array([1024], dtype=np.int64)
    no_slots = {g: np.array([NO_SLOT], dtype=np.int64) for g in graphs.groups}  # writes no KV

    in_graph = np.array([0], dtype=np.int64)  # the token is row 0 of the head's last ids

    def staged() -> None:
        graphs.staged.send(1, [0], position, [1025], no_slots, in_graph)
        graphs.graphs[1].replay()  # its head also writes the id to the pinned host ring

    def event() -> None:
        staged()
        torch.cuda.Event().record()

    def copied() -> None:  # the step as it was before 156055e and 89f928d (2026-11-24)
        graphs.staged.send(1, [0], position, [1025], no_slots)
        assert out.greedy is not None
        graphs.input_ids[:1].copy_(out.greedy[:1])  # the pending token, copied into the input ids
        graphs.graphs[1].replay()
        host = torch.empty(1, dtype=torch.int64, pin_memory=True)
        host.copy_(out.greedy[:1], non_blocking=True)  # the sampled id, copied to the host
        torch.cuda.Event().record()

    staged_us, event_us, copied_us = (per_iteration_us(f) for f in (staged, event, copied))
    print(f"\n{torch.cuda.get_device_name()}, {args.preset}, batch 1")
    rows = [
        ("decoder layers (a graph)", layers_us, ""),
        ("+ head, .float(), argmax", eager_us, f"head + argmax {eager_us - layers_us:.1f}"),
        ("+ fused head, eager", fused_us, f"head + argmax {fused_us - layers_us:.1f}"),
        ("engine graph (head inside)", engine_graph_us, f"head + argmax {engine_graph_us - layers_us:.1f}"),
        ("engine step (median TPOT)", step_us, f"beside the graph {step_us - engine_graph_us:.1f}"),
        ("head enqueue on the host", host_head_us, ""),
        ("engine graph + staged copy", staged_us, f"copy {staged_us - engine_graph_us:.1f}"),
        ("+ event (the step's GPU work)", event_us, f"event {event_us - staged_us:.1f}"),
        ("with the two copies instead", copied_us, f"copies {copied_us - event_us:.1f}"),
    ]
    for name, us, note in rows:
        print(f"{name:>28} {us:9.1f} us   {note}")

if __name__ == "__main__":
    main()
