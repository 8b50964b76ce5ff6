"""A worker process: rank r (r >= 1) of a model split over N ranks.

    python -m osserve.distributed.worker FD      (started by workers.py; FD: its socket to the engine)

It reads its WorkerSpec, joins the group, builds its rank as rank 0 does (engine/load.py's
build_rank: its share of the weights, its KV cache, its CUDA graphs, the same collectives in the
same order), says "ready", then runs every step it is sent: the previous step's sampled ids
arrive by a broadcast from rank 0, straight into the buffer its decode graphs read them from, and
its forward's all-reduces meet rank 0's. It computes no logits. On an error it sends the
traceback up and exits; it exits as well when the engine's process is gone (its pipe closes, or
its parent changes), so no worker outlives the engine.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from multiprocessing.connection import Connection

import torch

from osserve.child_process import become_engine_child
from osserve.distributed.collectives import RankGroup, join_store
from osserve.distributed.layout import ShardLayout
from osserve.distributed.messages import STOP, WorkerSpec, unpack_step
from osserve.engine.worker.runner import ModelRunner

log = logging.getLogger("osserve")


def main(argv: list[str]) -> int:
    conn = Connection(int(argv[0]))
    spec: WorkerSpec = conn.recv()
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s %(levelname)s %(name)s[rank {spec.rank}]: %(message)s")
    become_engine_child("osserve-parent-watch")
    try:
        runner, group = build(spec)
        conn.send(("ready",))
        serve(conn, runner, group)
    except EOFError:  # the engine is gone
        return 0
    except BaseException:
        try:
            conn.send(("error", traceback.format_exc()))
        except OSError:
            pass
        return 1
    # Nothing left to save: skip the interpreter's teardown (a second or more with torch loaded,
    # and the NCCL communicator's, which can hang after CUDA graphs captured its collectives),
    # which the engine's shutdown would wait for.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def build(spec: WorkerSpec) -> tuple[ModelRunner, RankGroup]:
    from osserve.engine.load import EngineArgs, build_rank, model_source

    args = spec.args
    assert isinstance(args, EngineArgs)
    device = torch.device(spec.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # Triton and the NCCL communicator use the current device
    else:  # N ranks share the host's cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // spec.size))
    group = RankGroup(join_store(spec.port, spec.size), spec.rank, spec.size, device, spec.backend)
    cfg, model_dir = model_source(args)
    layout = ShardLayout.of(cfg, spec.rank, spec.size, args.enable_expert_parallel)
    rank = build_rank(args, cfg, model_dir, device, layout, group,
                      lambda model, kv, block_size, dev: ModelRunner(model, kv, block_size, dev, head=False))
    return rank.runner, group


@torch.inference_mode()
def serve(conn: Connection, runner: ModelRunner, group: RankGroup) -> None:
    """Run the steps rank 0 sends, until STOP."""
    spare = torch.zeros(0, dtype=torch.int64, device=runner.device)
    while True:
        blob = conn.recv_bytes()
        if blob == STOP:
            return
        entries, copies, prev_len = unpack_step(blob)
        prev = None
        if prev_len >= 0:
            graphs = runner.graphs
            if graphs is not None and prev_len <= graphs.sampled.shape[0]:
                prev = graphs.sampled[:prev_len]  # where a decode graph reads them itself
            else:
                if spare.shape[0] < prev_len:
                    spare = torch.zeros(prev_len, dtype=torch.int64, device=runner.device)
                prev = spare[:prev_len]
            if prev_len:
                group.broadcast(prev)
        runner.run(entries, prev, copies)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
