"""The graphs' staged per-step inputs (engine/staged_inputs.py): one buffer of typed fields, the
pending tokens written on the device after the copy, and block tables reset only where stale."""

from __future__ import annotations

import numpy as np
import torch

from osserve.engine.cuda_graphs import DecodeGraphs
from osserve.engine.load import EngineArgs, build_engine
from osserve.engine.staged_inputs import BlockTableInput, Pending, StagedInputs


def test_fields_are_aligned_typed_views_written_whole_with_their_padding() -> None:
    staged = StagedInputs({"a": (np.int32, 3), "b": (np.int64, 2), "c": (np.int32, 5)}, torch.device("cpu"))
    assert [f.offset for f in staged.layout.values()] == [0, 16, 32] and staged.nbytes == 56
    assert staged.views["a"].dtype == torch.int32 and staged.views["b"].dtype == torch.int64
    host = staged.host()
    host.put("a", [7], -1)
    host.put("b", np.array([2**40, 5]), 0)
    host.put("c", [], 9)
    staged.send(host)
    assert staged.views["a"].tolist() == [7, -1, -1]
    assert staged.views["b"].tolist() == [2**40, 5]
    assert staged.views["c"].tolist() == [9] * 5


def test_pending_rows_take_the_previous_steps_tokens_after_the_copy() -> None:
    fields = {"input_ids": (np.int64, 4), "pending_rows": (np.int64, 4), "pending_prev": (np.int64, 4)}
    staged = StagedInputs(fields, torch.device("cpu"))
    host = staged.host()
    host.put("input_ids", [10, -1, 12, -1], 0)
    prev_tokens = torch.tensor([100, 101, 102])
    staged.send(host, staged.views["input_ids"], Pending(np.array([1, 3]), np.array([2, 0]), prev_tokens))
    assert staged.views["input_ids"].tolist() == [10, 102, 12, 100]


def test_block_tables_reset_only_the_columns_an_earlier_wider_step_left() -> None:
    tables = BlockTableInput(3, 6, torch.device("cpu"))
    tables.write(np.array([[1, 2, 3, 4], [5, -1, -1, -1]], dtype=np.int32))
    tables.write(np.array([[7, 8]], dtype=np.int32))  # narrower: row 0's columns 2, 3 are stale
    assert tables.tensor[0].tolist() == [7, 8, -1, -1, -1, -1]
    assert tables.tensor[1].tolist() == [5, -1, -1, -1, -1, -1]  # untouched: not in this step
    assert tables.written.tolist() == [2, 4, 0]


def test_decode_graphs_stage_a_step_as_the_model_reads_it() -> None:
    engine = build_engine(EngineArgs(load_format="dummy", preset="tiny", device="cpu", max_model_len=256,
                                     max_num_seqs=4, max_num_batched_tokens=512))
    runner = engine.runner
    graphs = DecodeGraphs(runner.model, runner.kv_caches, engine.kv.groups, runner.block_size, 256, 4)

    class NoReplay:
        def replay(self) -> None:
            pass

    for b in graphs.sizes:
        graphs.graphs[b] = NoReplay()  # type: ignore[assignment]
        graphs.outputs[b] = torch.zeros(b, 8)
    block = runner.block_size
    tables = {g: [[3, 4], [9]] for g in graphs.groups}
    pending = Pending(np.array([1]), np.array([0]), torch.tensor([555]))
    out = graphs.run([11, -7], [block + 1, 2], [block + 2, 3], tables, pending)
    assert out.shape[0] == 2
    assert graphs.input_ids[:2].tolist() == [11, 555] and graphs.positions[:2].tolist() == [block + 1, 2]
    assert graphs.seq_lens[:2].tolist() == [block + 2, 3] and graphs.seq_lens[2:].eq(0).all()
    for g in graphs.groups:
        assert graphs.slots[g][:2].tolist() == [4 * block + 1, 9 * block + 2] and graphs.slots[g][2:].eq(-1).all()
        assert graphs.tables[g].tensor[:2, :3].tolist() == [[3, 4, -1], [9, -1, -1]]
