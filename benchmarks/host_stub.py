"""Host-only stand-ins for the model's device work, so the engine's host path can be timed on a CPU.

A serving decode step on the GPU is host-bound: scheduling, building the batch, sampling's
bookkeeping, detokenising and shipping the deltas to the server. `build_host_only_engine` builds
the same path on the `tiny` preset on CPU and takes out only the model's arithmetic:

- decode steps go through DecodeGraphs.run (its numpy work and buffer copies) with a replay that
  does nothing, as the GPU run replays a captured graph;
- the model's forward (prefill steps) returns zeros, and compute_logits slices a preallocated
  [rows, vocab] tensor (random, so each row has its own argmax), so sampling runs on a small
  tensor (its greedy argmax over [229, 1024] still takes ~0.2 ms of "build+launch" on one CPU
  thread, where a GPU spends one launch);
- process_step_message times what the engine process sends up its pipe after each step.

What it cannot show: pinned-memory allocations, CUDA launches and copies (CPU tensors here), and
the pipe's write itself.
"""

from __future__ import annotations

import gc
import time
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch

from osserve.engine.engine import LLMEngine
from osserve.engine.load import EngineArgs, build_engine
from osserve.engine.process_engine import pack_outputs, unpack_output
from osserve.engine.worker.cuda_graphs import DecodeGraphs, StepOutputs


class _NoReplay:
    """A captured graph whose replay does nothing: the GPU's work is not what is measured."""

    def replay(self) -> None:
        pass


class StubModel:
    """The model as the runner calls it, with no arithmetic: zeros for hidden states, fixed logits."""

    def __init__(self, hidden_size: int, max_rows: int, vocab: int, seed: int = 0) -> None:
        self.hidden_size = hidden_size
        g = torch.Generator().manual_seed(seed)
        self.logits = torch.randn(max_rows, vocab, generator=g)  # [max_rows, vocab] float32

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: Any, kv_caches: Any) -> torch.Tensor:
        return torch.zeros(len(input_ids), self.hidden_size)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.logits[: hidden.shape[0]]

    def compute_logits_and_greedy(self, hidden: torch.Tensor) -> tuple[torch.Tensor, None]:
        return self.compute_logits(hidden), None


def build_host_only_engine(max_num_seqs: int, max_model_len: int = 4096, vocab: int = 1024) -> LLMEngine:
    """The tiny preset on CPU, set up as a GPU server runs it (decode graphs, async scheduling),
    with the model's work stubbed out."""
    # The stubs' few tensor ops (argmax, fills) stand for kernel launches: on one thread they take
    # microseconds; on a small shared CPU, torch's intra-op threads made a 60 KB fill take 8 ms.
    torch.set_num_threads(1)
    engine = build_engine(EngineArgs(load_format="dummy", preset="tiny", device="cpu", max_model_len=max_model_len,
                                     max_num_seqs=max_num_seqs, max_num_batched_tokens=8192))
    runner = engine.runner
    graphs = DecodeGraphs(runner.model, runner.kv_caches, engine.kv.groups, runner.block_size,
                          max_model_len, max_num_seqs)
    hidden = engine.model_config.hidden_size
    for b in graphs.sizes:
        graphs.graphs[b] = _NoReplay()  # type: ignore[assignment]
        graphs.outputs[b] = StepOutputs(torch.zeros(b, hidden))
    runner.graphs = graphs
    runner.model = StubModel(hidden, 8192, vocab)  # type: ignore[assignment]
    gc.collect()  # as the engine process does once its engine is built (process_engine._engine_main)
    gc.freeze()
    return engine


def process_step_message(engine: LLMEngine, deltas: list[Any]) -> tuple[float, float, float, int]:
    """(stats s, dumps s, loads s, bytes) of the message _engine_main sends after a step, pickled
    as Connection.send pickles it; loads (with rebuilding the deltas) is the server's reader
    thread's share."""
    t0 = time.perf_counter()
    stats = engine.stats()
    t1 = time.perf_counter()
    data = ForkingPickler.dumps(("out", pack_outputs(deltas), stats))
    t2 = time.perf_counter()
    [unpack_output(item) for item in ForkingPickler.loads(data)[1]]
    t3 = time.perf_counter()
    return t1 - t0, t2 - t1, t3 - t2, len(data)
