"""The engine's speculative step (engine.py runs it in place of its plain step).

A step in which some request holds or wants drafts (speculative/decoder.py decides) speculates: the
target verifies each request's drafts in the one forward, the tokens it keeps come back (one or more
a request), a draft tree's accepted branch has its KV moved into place, and the proposer drafts the
next step's tokens. Requests without drafts sample their one token in the same step, as in a plain
one (grammars, penalties, logprobs). Such steps are synchronous (engine.py finishes the step in
flight first): the accepted counts decide the next step.

The step is the engine's own loop, kept apart: it reaches the engine through `SpeculatingEngine`
(engine.py imports this module, so this one names the engine by its shape, not its class).
"""

from __future__ import annotations

import itertools
import time
from typing import Protocol

import numpy as np
import torch

from osserve.config import SchedulerConfig
from osserve.engine.core.outputs import CompletionDelta
from osserve.engine.core.request import Request
from osserve.engine.core.scheduler import Scheduler
from osserve.engine.in_flight import InFlightStep, start_host_copy
from osserve.engine.step_batch import step_batch
from osserve.engine.worker.runner import ModelRunner
from osserve.engine.worker.sampler import SamplerOutput
from osserve.speculative.decoder import SpeculativeDecoder
from osserve.structured.grammar_process import RemoteGrammars
from osserve.structured.matchers import Grammars, MaskBits


class SpeculatingEngine(Protocol):
    """What a speculative step uses of the engine (engine.py's LLMEngine)."""

    scheduler: Scheduler
    scheduler_config: SchedulerConfig
    runner: ModelRunner
    grammars: Grammars | RemoteGrammars
    requests: dict[str, Request]
    generators: dict[str, torch.Generator]
    prompt_tokens_total: int
    speculating: bool  # the last step was a speculative one (its drafts may wait)

    def _launch_sample(self, rows: list[Request], logits: torch.Tensor, greedy: torch.Tensor | None,
                       token_masks: tuple[list[int], MaskBits] | None = None) -> SamplerOutput | None: ...

    def _finish(self, step: InFlightStep, result: SamplerOutput | None = None) -> list[CompletionDelta]: ...


def speculates_next(engine: SpeculatingEngine, spec: SpeculativeDecoder) -> bool:
    """Whether the next step speculates; drafts left from the last speculative step are
    dropped when it does not (they were meant for a step that verifies them)."""
    sched = engine.scheduler
    free = max(0, engine.scheduler_config.max_num_seqs - len(sched.running))
    engaged = spec.engaged(sched.running, list(itertools.islice(sched.waiting, free)))
    if engine.speculating and not engaged:
        for r in sched.running:
            r.drafts = None
    engine.speculating = engaged
    return engaged


def speculative_step(engine: SpeculatingEngine, spec: SpeculativeDecoder) -> list[CompletionDelta]:
    """One step of speculative decoding (module docstring); requests without drafts sample
    their one token through the sampler as in any step (grammars, penalties, logprobs)."""
    t0 = time.perf_counter()
    out = engine.scheduler.schedule(lookahead=spec.lookahead)
    if not out.scheduled:
        return []
    t1 = time.perf_counter()
    entries, rows, prompt_tokens = step_batch(out, engine.requests, None)
    trees = {r.request_id: r.drafts for r in rows if r.drafts is not None}
    step = engine.runner.run(entries, None, out.block_copies, speculative=True, capture=spec.capture_layers)
    engine.scheduler.advance(out)
    engine.prompt_tokens_total += prompt_tokens
    first, k = [], 0  # each sampling request's first logits row: its root's
    for r in rows:
        first.append(k)
        k += 1 + (len(r.drafts) if r.drafts is not None else 0)
    plain = [i for i, r in enumerate(rows) if r.drafts is None]
    drafting = [i for i, r in enumerate(rows) if r.drafts is not None]
    masks = engine.grammars.masks([rows[i].request_id for i in plain]) if engine.grammars.states else None
    index = torch.tensor([first[i] for i in plain], dtype=torch.int64, device=step.logits.device)
    result = engine._launch_sample([rows[i] for i in plain], step.logits[index], None,
                                   (masks.rows, masks.bits) if masks is not None and masks.rows else None)
    sampled: dict[str, int | list[int]] = {}
    if drafting:
        index = torch.tensor([j for i in drafting for j in range(first[i], first[i] + 1 + len(trees[
            rows[i].request_id]))], dtype=torch.int64, device=step.logits.device)
        verdicts = spec.verify(step.logits[index], [rows[i] for i in drafting], engine.generators)
        by_id = {rows[i].request_id: v for i, v in zip(drafting, verdicts, strict=True)}
        sampled.update((rid, v.tokens) for rid, v in by_id.items())
        engine.runner.move_kv(spec.kv_moves(out, by_id, trees))
    else:
        by_id = {}
    plain_rows = [rows[i] for i in plain]
    flight = start_host_copy(out, plain_rows, result, (t1 - t0, time.perf_counter() - t1, True, False))
    plain_ids = result.token_ids.tolist() if result is not None else []
    sampled.update((r.request_id, t) for r, t in zip(plain_rows, plain_ids, strict=True))
    flight.sampled = sampled
    if engine.grammars.states:
        flight.grammar_dead = {plain_rows[i].request_id for i in masks.dead} if masks is not None else set()
        flight.grammar_dead |= set(masks.rejected) if masks is not None else set()  # e.g. a grammar process died
        flight.grammar_dead |= engine.grammars.accept({r.request_id: t for r, t in zip(plain_rows, plain_ids,
                                                                                       strict=True)})
    deltas = engine._finish(flight, result)
    offsets = step.entry_rows or np.cumsum([0] + [len(e.token_ids) for e in entries[:-1]]).tolist()
    spec.propose(out, offsets, by_id, step.aux_hidden if spec.capture_layers else step.hidden, engine.requests)
    return deltas
