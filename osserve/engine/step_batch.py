"""A scheduled step as the model runner's batch (engine.py's plain steps and speculative_step.py's):
one BatchEntry per scheduled request, in the scheduler's order, the requests that sample (in row
order), and the step's prompt tokens (for the counters)."""

from __future__ import annotations

from osserve.engine.core.request import PENDING_TOKEN, Request
from osserve.engine.core.scheduler import SchedulerOutput
from osserve.engine.in_flight import InFlightStep
from osserve.engine.worker.runner import BatchEntry


def step_batch(out: SchedulerOutput, requests: dict[str, Request],
               prev: InFlightStep | None) -> tuple[list[BatchEntry], list[Request], int]:
    """The runner's entries, the requests that sample (in row order) and the step's prompt tokens,
    in one pass over the scheduled requests. `prev`: the step in flight, whose sampled ids on the
    device are the inputs of requests whose last token is still pending (async scheduling)."""
    entries, rows, prompt_tokens = [], [], 0
    for s in out.scheduled:
        req = requests[s.request_id]
        if s.num_drafts:
            entries.append(verify_entry(req, s.start, s.block_tables))
            rows.append(req)
            continue
        end = s.start + s.num_new_tokens
        tokens = [req.token_at(s.start)] if s.num_new_tokens == 1 else req.token_slice(s.start, end)
        prev_row = -1
        if tokens[-1] == PENDING_TOKEN:  # async scheduling: the previous step's sampled id, on the device
            assert prev is not None and tokens.count(PENDING_TOKEN) == 1
            prev_row = prev.rows[s.request_id]
        entries.append(BatchEntry(tokens, s.start, s.block_tables, s.needs_sample, prev_row))
        if s.needs_sample:
            rows.append(req)
        if s.start < req.num_prompt_tokens:
            prompt_tokens += min(end, req.num_prompt_tokens) - s.start
    return entries, rows, prompt_tokens


def verify_entry(req: Request, start: int, tables: dict[str, list[int]]) -> BatchEntry:
    """A request's last token (the root) and its drafts, verified in one chunk."""
    tree = req.drafts
    assert tree is not None
    chain = tree.is_chain
    return BatchEntry([req.token_at(start), *tree.tokens], start, tables, True, num_drafts=len(tree),
                      draft_depths=None if chain else tree.depths(),
                      tree_bits=None if chain else tree.attention_bits())
