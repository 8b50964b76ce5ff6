"""A step's device inputs written from the host: async scheduling's pending tokens
(ModelRunner.fill_pending), the graphs' block tables (BlockTableBuffer) and their staged small
inputs (StagedInputs), on CPU tensors."""

from __future__ import annotations

import numpy as np
import torch

from osserve.engine.worker.cuda_graphs import (
    BlockTableBuffer,
    BlockTableRows,
    DecodeGraphs,
    StepOutputs,
    block_table_array,
)
from osserve.engine.worker.runner import BatchEntry, ModelRunner
from osserve.engine.worker.staged_inputs import StagedInputs

PENDING = -7  # stands for engine.PENDING_TOKEN: the runner only reads prev_row


def runner() -> ModelRunner:
    return ModelRunner(None, [], 16, torch.device("cpu"))  # type: ignore[arg-type]


def entry(tokens: list[int], prev_row: int = -1) -> BatchEntry:
    return BatchEntry(tokens, 0, {}, True, prev_row)


def test_pending_tokens_same_batch_as_before() -> None:
    """Every row takes the same row of the previous step's ids (the one-copy path)."""
    ids = torch.tensor([PENDING, PENDING, PENDING, 99])
    runner().fill_pending(ids, [entry([PENDING], 0), entry([PENDING], 1), entry([PENDING], 2)],
                          torch.tensor([11, 12, 13, 14]))
    assert ids.tolist() == [11, 12, 13, 99]


def test_pending_tokens_reordered_mixed_and_partial() -> None:
    """Rows whose previous row differs, a prefill chunk between them, a row with every token known."""
    entries = [entry([PENDING], 2), entry([5, 6, PENDING], 0), entry([8]), entry([PENDING], 1)]
    ids = torch.tensor([PENDING, 5, 6, PENDING, 8, PENDING])
    runner().fill_pending(ids, entries, torch.tensor([21, 22, 23]))
    assert ids.tolist() == [23, 5, 6, 21, 8, 22]
    ids = torch.tensor([PENDING, 4])  # row 0 takes previous row 1: not the copy path
    runner().fill_pending(ids, [entry([PENDING], 1), entry([4])], torch.tensor([31, 32]))
    assert ids.tolist() == [32, 4]
    ids = torch.tensor([1, 2])  # nothing pending, or no previous step: untouched
    runner().fill_pending(ids, [entry([1]), entry([2])], torch.tensor([9, 9]))
    runner().fill_pending(ids, [entry([1]), entry([2])], None)
    assert ids.tolist() == [1, 2]


def test_block_tables_reset_past_their_width_only_where_stale() -> None:
    buf = BlockTableBuffer(3, 6, torch.device("cpu"))
    buf.write(block_table_array([[1, 2, 3, 4], [5]], 3))
    assert buf.tensor.tolist() == [[1, 2, 3, 4, -1, -1], [5, -1, -1, -1, -1, -1], [-1] * 6]
    buf.write(block_table_array([[7, 8]], 1))  # narrower: row 0's old columns 2-3 are reset
    assert buf.tensor[0].tolist() == [7, 8, -1, -1, -1, -1]
    assert buf.tensor[1].tolist() == [5, -1, -1, -1, -1, -1]  # rows past the step keep theirs
    buf.write(block_table_array([[7, 8, 9], [6, 6], [1]], 3))
    assert buf.tensor.tolist() == [[7, 8, 9, -1, -1, -1], [6, 6, -1, -1, -1, -1], [1, -1, -1, -1, -1, -1]]
    assert np.array_equal(buf.written, [3, 3, 3])


def test_block_tables_equal_to_the_last_write_are_not_copied_again() -> None:
    buf = BlockTableBuffer(2, 4, torch.device("cpu"))
    buf.write(block_table_array([[1, 2]], 1))
    buf.tensor[0, 0] = 42  # stands for the device's copy: an unchanged write leaves it be
    buf.write(block_table_array([[1, 2]], 1))
    assert buf.tensor[0].tolist() == [42, 2, -1, -1]
    buf.write(block_table_array([[1, 2, 3]], 1))
    assert buf.tensor[0].tolist() == [1, 2, 3, -1]


def test_incremental_block_table_rows_equal_a_fresh_build() -> None:
    """BlockTableRows against block_table_array over a random run of decode-like steps: tables
    grow, blocks turn into holes without the table growing (a sliding window), requests come and
    go and the batch is reordered or padded; each step's array equals a fresh build, and an array
    handed out earlier never changes afterwards."""
    rng = np.random.default_rng(0)
    tables = [list(rng.integers(0, 1000, rng.integers(1, 12))) for _ in range(24)]
    rows = BlockTableRows()
    handed: list[tuple[np.ndarray, np.ndarray]] = []
    reused = unchanged = 0
    last_rows = -1
    for _ in range(400):
        move = rng.random()
        if move < 0.5:  # a few tables grow by a block, as decodes cross a block boundary
            for i in rng.choice(len(tables), 2, replace=False):
                tables[i].append(int(rng.integers(0, 1000)))
        elif move < 0.7:  # a block leaves the window: a hole, the table's length unchanged
            i = int(rng.integers(len(tables)))
            tables[i][int(rng.integers(len(tables[i])))] = -1
        elif move < 0.78:  # a request ends, another joins
            tables[int(rng.integers(len(tables)))] = list(rng.integers(0, 1000, rng.integers(1, 30)))
        elif move < 0.84:
            rng.shuffle(tables)  # another order
        elif move < 0.9:
            tables = tables[:-1] if len(tables) > 8 else tables + [[5]]
        num_rows = len(tables) + int(rng.integers(0, 2))  # a graph's size pads the batch
        unchanged += move >= 0.9 and num_rows == last_rows
        last_rows = num_rows
        array = rows.rows(tables, num_rows)
        reused += any(array is old for old, _ in handed[-1:])
        assert np.array_equal(array, block_table_array(tables, num_rows))
        handed.append((array, array.copy()))
    assert all(np.array_equal(a, copy) for a, copy in handed)
    assert reused >= unchanged > 5  # unchanged steps hand back the same array


def test_staged_inputs_one_buffer_typed_views_and_padding() -> None:
    staged = StagedInputs(8, ["sliding", "full"], torch.device("cpu"))
    assert staged.seq_lens.dtype == torch.int32 and staged.positions.dtype == torch.int64
    assert staged.slots["full"].tolist() == [-1] * 8  # before any step: no KV write
    assert staged.pending_rows.tolist() == [-1] * 8
    staged.send(4, [5, -1, 7], np.array([10, 20, 30]), [11, 21, 31],
                {"sliding": np.array([1, 2, 3]), "full": np.array([4, 5, 6])}, np.array([-1, 2, -1]))
    assert staged.input_ids[:4].tolist() == [5, -1, 7, 0]
    assert staged.pending_rows[:4].tolist() == [-1, 2, -1, -1]
    assert staged.positions[:4].tolist() == [10, 20, 30, 0]
    assert staged.seq_lens[:4].tolist() == [11, 21, 31, 0]
    assert staged.slots["sliding"][:4].tolist() == [1, 2, 3, -1] and staged.slots["full"][:4].tolist() == [4, 5, 6, -1]
    staged.send(2, [9], np.array([40]), [41], {"sliding": np.array([8]), "full": np.array([9])})  # the other buffer
    assert staged.turn == 0
    assert staged.input_ids[:2].tolist() == [9, 0]  # rows past b: not read by the graph of b rows
    assert staged.pending_rows[:2].tolist() == [-1, -1]  # none given: every id is the one sent
    assert staged.seq_lens[:2].tolist() == [41, 0] and staged.slots["full"][:2].tolist() == [9, -1]


class _NoReplay:
    def replay(self) -> None:
        pass


def test_graph_reads_the_pending_tokens_where_its_head_left_them() -> None:
    """A decode step after a step whose greedy ids the graphs' head wrote (into DecodeGraphs.sampled)
    stages each row's row of them, for the graph's embedding to read (no copy before the replay); a
    step after any other sampler's ids copies them into the input ids first, as before. The head's
    ids also go to a row of the pinned host ring, the two rows in turn."""
    graphs = DecodeGraphs(torch.nn.Linear(1, 1), [], ["full"], 16, 256, 4)  # type: ignore[arg-type]
    for b in graphs.sizes:
        graphs.graphs[b] = _NoReplay()  # type: ignore[assignment]
        graphs.outputs[b] = StepOutputs(torch.zeros(b, 1), torch.zeros(b, 5), graphs.sampled[:b])
    r = runner()
    r.graphs = graphs
    entries = [BatchEntry([PENDING], 3, {"full": [0]}, True, 1), BatchEntry([PENDING], 7, {"full": [1]}, True, 0)]
    assert graphs.holds(graphs.sampled[:3]) and not graphs.holds(torch.tensor([41, 42]))
    first = r.run(entries, graphs.sampled[:3])
    assert graphs.staged.pending_rows[:2].tolist() == [1, 0]
    assert graphs.input_ids[:2].tolist() == [PENDING, PENDING]  # left for the graph
    second = r.run(entries, torch.tensor([41, 42]))  # the ids of a sampler outside the graph
    assert graphs.staged.pending_rows[:2].tolist() == [-1, -1]
    assert graphs.input_ids[:2].tolist() == [42, 41]
    # The head's ids go to the host ring's rows in turn; each step tells its graph which.
    assert first.greedy_host is not None and second.greedy_host is not None
    assert first.greedy_host.data_ptr() == graphs.sampled_host[0].data_ptr() and len(first.greedy_host) == 2
    assert second.greedy_host.data_ptr() == graphs.sampled_host[1].data_ptr()
    assert graphs.staged.host_slot.tolist() == [1]


def test_decode_graphs_cover_every_batch_up_to_max_num_seqs() -> None:
    """A --max-num-seqs 512 server's decodes of 257-512 rows replay a graph too (they ran eagerly
    when the sizes stopped at 256: the 120b's c=512 on an H200, BENCHMARKS.md); sizes stop at the
    server's bound."""
    big = DecodeGraphs(torch.nn.Linear(1, 1), [], ["full"], 16, 256, 512)  # type: ignore[arg-type]
    assert big.sizes[-1] == 512 and all(big.sizes[i] < big.sizes[i + 1] for i in range(len(big.sizes) - 1))
    assert max(b - a for a, b in zip(big.sizes, big.sizes[1:], strict=False)) <= 32  # padding at most 31 rows
    assert big.staged.input_ids.shape[0] == 512
    small = DecodeGraphs(torch.nn.Linear(1, 1), [], ["full"], 16, 256, 256)  # type: ignore[arg-type]
    assert small.sizes[-1] == 256
