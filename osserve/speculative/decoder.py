"""The engine's speculative decoding: which requests speculate, verifying their drafts, moving an
accepted tree branch's KV into place, proposing the next drafts, and the counters.

A step speculates (engine/speculative_step.py) while at most `disable_by_batch_size` requests run
and one of them wants drafts. Such a step is synchronous: how many tokens each request gets decides
the next step, so its tokens reach the host before the next is scheduled.

Which requests draft (the others, in the same steps, sample one token as without speculation):
- not those asking for logprobs, penalties, forced tokens or an output grammar (their sampler
  needs each token before the next), nor one still short of min_tokens;
- auto-off: a request whose drafts are mostly rejected pauses. Each verified step updates its mean
  of accepted drafts (weight 1/8, from 0.8); below PAUSE_BELOW it drafts nothing for PAUSE_STEPS steps,
  doubling up to MAX_PAUSE while it keeps failing, so text the drafts cannot guess costs a probe
  now and then, not a verify every step. When every request pauses, steps run as without
  speculation (async scheduling, CUDA graphs).
EAGLE3's draft sees what its first pass wrote; positions a request decoded without speculating
(paused, or in a step above the batch limit) keep older draft KV: acceptance suffers, outputs do not.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from osserve.engine.core.request import Request, RequestStatus
from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.core.scheduler import SchedulerOutput
from osserve.speculative.config import SpeculativeConfig
from osserve.speculative.eagle import DraftInput, Eagle3Proposer
from osserve.speculative.ngram import NgramProposer
from osserve.speculative.oracle import AcceptanceOracle
from osserve.speculative.tree import DraftTree
from osserve.speculative.verify import Verdict, VerifyRequest, verify

# Auto-off's constants, a first guess to be tuned against benchmarks/bench_spec.py's AL-1.0 rows:
# a request that accepts nothing pauses after 7 verified steps; at a mean acceptance length of 2
# (one draft accepted a step) a pause needs a run of about ten rejected steps.
PAUSE_BELOW = 0.3  # mean accepted drafts per verified step under which a request pauses
PAUSE_STEPS = 16
MAX_PAUSE = 256
EMA_WEIGHT = 0.125
START_MEAN = 0.8


@dataclass
class SpecStats:
    """vLLM's counters: drafts verified, draft tokens proposed, draft tokens accepted (in all and
    by depth, 1-based position in the draft)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / max(1, self.num_drafts)


@dataclass
class _Acceptance:
    mean: float = START_MEAN
    paused_until: int = 0
    pause: int = PAUSE_STEPS


class SpeculativeDecoder:
    def __init__(self, config: SpeculativeConfig, proposer: Eagle3Proposer | NgramProposer, vocab_size: int,
                 max_model_len: int) -> None:
        self.config, self.proposer = config, proposer
        self.vocab_size, self.max_model_len = vocab_size, max_model_len
        self.stats = SpecStats(accepted_per_position=[0] * config.num_speculative_tokens)
        self.acceptance: dict[str, _Acceptance] = {}
        self.steps = 0
        self.oracle: AcceptanceOracle | None = None  # benchmark-only (speculative/oracle.py)

    def reset_stats(self) -> None:
        self.stats = SpecStats(accepted_per_position=[0] * self.config.num_speculative_tokens)
        self.acceptance.clear()

    @property
    def capture_layers(self) -> tuple[int, ...]:
        return self.proposer.capture_layers if isinstance(self.proposer, Eagle3Proposer) else ()

    @property
    def lookahead(self) -> int:
        return self.config.lookahead_slots

    @staticmethod
    def allowed(params: SamplingParams) -> bool:
        """Whether the request's sampling lets it draft at all."""
        return (params.logprobs is None and params.forced_token_ids is None and params.structured is None
                and not params.penalized)

    def depth_for(self, req: Request) -> int:
        """Draft tokens the request may verify next step: 0 where it does not speculate."""
        p = req.sampling_params
        if not self.allowed(p) or req.num_output_tokens < p.min_tokens:
            return 0
        acc = self.acceptance.get(req.request_id)
        if acc is not None and acc.paused_until > self.steps:
            return 0
        left = self.max_model_len - req.num_tokens
        if p.max_tokens is not None:
            left = min(left, p.max_tokens - req.num_output_tokens)
        return max(0, min(self.config.num_speculative_tokens, left - 1))

    def engaged(self, running: list[Request], waiting: list[Request]) -> bool:
        """Whether the next step speculates: few enough requests, and one of them drafts."""
        if len(running) + len(waiting) > self.config.disable_by_batch_size:
            return False
        return any(r.drafts is not None or self.depth_for(r) > 0 for r in running) or \
            any(self.depth_for(r) > 0 for r in waiting)

    # ------------------------------------------------------------------ verification
    def verify(self, logits: torch.Tensor, requests: list[Request], generators: dict[str, torch.Generator],
               ) -> list[Verdict]:
        """logits: each request's root row then its drafts' rows, in order. Counts and auto-off."""
        self.steps += 1
        items = [VerifyRequest(r.sampling_params, r.drafts or DraftTree((), ()), generators.get(r.request_id))
                 for r in requests]
        verdicts = verify(logits, items, self.vocab_size)
        for req, item, verdict in zip(requests, items, verdicts, strict=True):
            self._record(req.request_id, len(item.tree), item.tree.max_depth, len(verdict.accepted))
        return verdicts

    def _record(self, request_id: str, num_tokens: int, depth: int, accepted: int) -> None:
        s = self.stats
        s.num_drafts += 1
        s.num_draft_tokens += num_tokens
        s.num_accepted_tokens += accepted
        for position in range(accepted):
            s.accepted_per_position[position] += 1
        acc = self.acceptance.setdefault(request_id, _Acceptance())
        acc.mean += EMA_WEIGHT * (accepted - acc.mean)
        if acc.mean < PAUSE_BELOW:
            acc.paused_until = self.steps + acc.pause
            acc.pause = min(2 * acc.pause, MAX_PAUSE)
            acc.mean = PAUSE_BELOW + EMA_WEIGHT  # the probe after the pause gets a fair chance
        elif acc.mean >= 2 * PAUSE_BELOW:
            acc.pause = PAUSE_STEPS

    @staticmethod
    def kv_moves(out: SchedulerOutput, verdicts: dict[str, Verdict], trees: dict[str, DraftTree],
                 ) -> list[tuple[dict[str, list[int]], int, int]]:
        """Where a tree's accepted nodes (verified at the root's position + 1 + node) must move:
        to the root's position + their depth (a chain's are there already)."""
        moves = []
        for s in out.scheduled:
            tree = trees.get(s.request_id)
            if tree is None or tree.is_chain:
                continue
            for depth, node in enumerate(verdicts[s.request_id].accepted, start=1):
                if node + 1 != depth:
                    moves.append((s.block_tables, s.start + 1 + node, s.start + depth))
        return moves

    # ------------------------------------------------------------------ the next drafts
    def propose(self, out: SchedulerOutput, offsets: list[int], verdicts: dict[str, Verdict],
                states: torch.Tensor | None, requests: dict[str, Request]) -> None:
        """Drafts for the next step (Request.drafts) of the step's requests still running, and for
        EAGLE3 the draft's KV of every position whose target states this step computed."""
        if isinstance(self.proposer, NgramProposer):
            for s in out.scheduled:
                req = requests.get(s.request_id)
                if req is None or req.status is not RequestStatus.RUNNING or not s.needs_sample:
                    continue
                depth = self.depth_for(req)
                tokens = self.proposer.propose(s.request_id, req.all_token_ids, depth) if depth else []
                self._attach(req, DraftTree.chain(tokens) if tokens else None)
            return
        assert states is not None  # the captured layers' outputs (or the last hidden state: Eagle3-v2)
        inputs, owners = [], []
        for s, offset in zip(out.scheduled, offsets, strict=True):
            req = requests.get(s.request_id)
            if req is None or req.status is not RequestStatus.RUNNING or not self.allowed(req.sampling_params):
                continue
            known = s.num_new_tokens - s.num_drafts
            rows = list(range(offset, offset + known))
            verdict = verdicts.get(s.request_id)
            if verdict is not None:
                rows += [offset + known + node for node in verdict.accepted]
            # The token after each row's position: the step's own tokens are appended already.
            tokens = req.token_slice(s.start + 1, s.start + len(rows) + 1)
            depth = self.depth_for(req) if s.needs_sample else 0
            inputs.append(DraftInput(rows, s.start, tokens, s.block_tables["full"], depth))
            owners.append(req)
        for req, tree in zip(owners, self.proposer.propose(states, inputs), strict=True):
            self._attach(req, tree)

    def _attach(self, req: Request, tree: DraftTree | None) -> None:
        if tree is not None and self.oracle is not None:
            tree = self.oracle.rewrite(req.request_id, req.output_token_ids, tree)
        req.drafts = tree if tree is not None and len(tree) else None

    def drop(self, request_id: str) -> None:
        self.acceptance.pop(request_id, None)
        if isinstance(self.proposer, NgramProposer):
            self.proposer.drop(request_id)
