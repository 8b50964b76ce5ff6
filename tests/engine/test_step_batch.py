"""engine/step_batch.py: a scheduled step as the runner's batch, on plain Request objects."""

from __future__ import annotations

import pytest
import torch

from osserve.engine.core.request import PENDING_TOKEN, Request
from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.core.scheduler import ScheduledRequest, SchedulerOutput
from osserve.engine.in_flight import InFlightStep
from osserve.engine.step_batch import step_batch


def request(rid: str, prompt: list[int], output: tuple[int, ...] = (), pending: int = 0) -> Request:
    return Request(rid, list(prompt), SamplingParams(max_tokens=8), 0.0, output_token_ids=list(output),
                   num_pending=pending)


def in_flight(rows: dict[str, int]) -> InFlightStep:
    empty = torch.empty(0, dtype=torch.int64)
    return InFlightStep(SchedulerOutput(), rows, [], empty, empty, None, (0.0, 0.0, False, False))


def test_entries_rows_and_prompt_tokens() -> None:
    """A prompt's last chunk, a decode whose input is in flight, a first chunk that does not sample, and
    a decode whose input is known: their entries in order, the sampling rows, the prompt tokens."""
    reqs = {
        "a": request("a", list(range(10))),
        "b": request("b", [1, 2, 3, 4, 5], output=(7,), pending=1),
        "c": request("c", list(range(100, 108))),
        "d": request("d", [1, 2, 3], output=(5, 6)),
    }
    tables = {"full": [0]}
    out = SchedulerOutput([ScheduledRequest("a", 4, 6, tables, True), ScheduledRequest("b", 6, 1, tables, True),
                           ScheduledRequest("c", 0, 4, tables, False), ScheduledRequest("d", 4, 1, tables, True)])
    entries, rows, prompt_tokens = step_batch(out, reqs, in_flight({"x": 0, "b": 3}))
    assert [e.token_ids for e in entries] == [[4, 5, 6, 7, 8, 9], [PENDING_TOKEN], [100, 101, 102, 103], [6]]
    assert [e.start_pos for e in entries] == [4, 6, 0, 4]
    assert [e.prev_row for e in entries] == [-1, 3, -1, -1]  # b's input is row 3 of the step in flight
    assert [e.sample for e in entries] == [True, True, False, True]
    assert [r.request_id for r in rows] == ["a", "b", "d"]
    assert prompt_tokens == 6 + 4


def test_a_pending_input_needs_the_step_in_flight() -> None:
    reqs = {"b": request("b", [1, 2], output=(3,), pending=1)}
    out = SchedulerOutput([ScheduledRequest("b", 3, 1, {"full": [0]}, True)])
    with pytest.raises(AssertionError):
        step_batch(out, reqs, None)
