"""The host's fast paths give what the general paths give.

Scheduling: two schedulers run the same workload in lockstep: one as shipped, one whose KV manager never takes
allocate_slots' early return (nor can_allocate_all's, keyed on the same bounds). Every step's
scheduled output, every block table and every pool's free order must match, through block
boundaries, sliding-window releases, prefix-cache hits, preemptions and aborts. Outputs: a
request with no stop strings gets the same deltas as through the stop-string path."""

from __future__ import annotations

from typing import Any

from osserve.config import SchedulerConfig
from osserve.engine.core.kv_cache import KVCacheManager, _RequestBlocks
from osserve.engine.core.output_processor import OutputProcessor
from osserve.engine.core.outputs import CompletionDelta, TokenLogprob
from osserve.engine.core.request import PENDING_TOKEN, Request
from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.core.scheduler import RequestUpdate, Scheduler, SchedulerOutput
from osserve.tokenizer import load_tokenizer

GROUPS = [("sliding", 128), ("full", None)]
BS = 16


class GeneralPathKV(KVCacheManager):
    """Leaves the early-return bounds at 0, so every call takes the general path."""

    def _set_quiet(self, rb: _RequestBlocks) -> None:
        rb.capacity = rb.quiet_until = 0


def make(kv_class: type[KVCacheManager], num_blocks: int) -> Scheduler:
    kv = kv_class(BS, num_blocks, GROUPS, enable_prefix_caching=True)
    return Scheduler(SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=96, max_model_len=4096), kv)


def workload() -> dict[int, list[Request]]:
    """Requests by the step they arrive at: shared 48-token prefixes (prefix-cache hits once the
    first has computed them), prompts and outputs long enough to pass the 128-token window."""
    shared = list(range(1000, 1048))
    arrivals: dict[int, list[Request]] = {}
    for i in range(10):
        prompt = shared + list(range(i * 7, i * 7 + 5 + 13 * i)) if i % 2 == 0 else list(range(i, i + 20 + 9 * i))
        params = SamplingParams(max_tokens=150 + 10 * i, ignore_eos=True)
        arrivals.setdefault(3 * i, []).append(Request(f"r{i}", prompt, params, 0.0))
    return arrivals


def fake_next(req: Request, upto: int) -> int:
    return (sum(req.token_slice(max(0, upto - 3), upto)) * 31 + 7) % 1000


def snapshot(s: Scheduler, out: SchedulerOutput) -> tuple[object, ...]:
    scheduled = [(x.request_id, x.start, x.num_new_tokens, x.needs_sample,
                  {g: list(t) for g, t in x.block_tables.items()}) for x in out.scheduled]
    kv = s.kv
    tables = {rid: ({g: list(t) for g, t in rb.tables.items()}, dict(rb.released), rb.registered)
              for rid, rb in kv.requests.items()}
    pools = {g: (list(p.free), dict(p.cached), [b.ref_count for b in p.blocks]) for g, p in kv.pools.items()}
    return scheduled, list(out.preempted), tables, pools


def quiet_steps(s: Scheduler) -> int:
    """Running requests whose next one-token step is within the early-return bounds."""
    n = 0
    for r in s.running:
        rb = s.kv.requests.get(r.request_id)
        n += rb is not None and r.num_computed_tokens < rb.quiet_until and r.num_computed_tokens + 1 <= rb.capacity
    return n


def test_fast_paths_schedule_exactly_as_the_general_paths() -> None:
    fast, slow = make(KVCacheManager, 60), make(GeneralPathKV, 60)
    arrivals, quiet, step = workload(), 0, 0
    while step == 0 or fast.running or fast.waiting:
        for r in arrivals.get(step, []):
            for s in (fast, slow):
                s.add_request(Request(r.request_id, list(r.prompt_token_ids), r.sampling_params, 0.0))
        if step == 200:
            for s in (fast, slow):
                s.abort("r3")
        quiet += quiet_steps(fast)
        for n in (1, 16):
            assert fast.kv.can_allocate_all(fast.running, n) == slow.kv.can_allocate_all(slow.running, n)
        outs = [s.schedule() for s in (fast, slow)]
        assert snapshot(fast, outs[0]) == snapshot(slow, outs[1]), f"step {step}"
        for s, out in zip((fast, slow), outs, strict=True):
            sampled = {x.request_id: fake_next(s.requests[x.request_id], x.start + x.num_new_tokens)
                       for x in out.scheduled if x.needs_sample}
            s.update_from_output(out, sampled)
        step += 1
    assert fast.num_preemptions > 0 and fast.kv.stats.prefix_cache_hits > 0  # the workload reached them
    assert quiet > step  # and the early return was taken on most decode steps
    assert all(fast.kv.num_free_blocks(g) == 60 for g in fast.kv.groups)


class GeneralOutputs(OutputProcessor):
    """Sends every step through the general path (stop strings, hold-back, flush)."""

    def _plain_delta(self, req: Request, upd: RequestUpdate, state: Any,  # type: ignore[override]
                     logprob: TokenLogprob | None) -> CompletionDelta | None:
        return self._general_delta(req, upd, state, logprob)


def test_plain_output_deltas_equal_the_general_path() -> None:
    tok = load_tokenizer()
    ids = tok.encode("héllo — 你好 🙂🙂 Здравствуй, world") + [200002]  # ends on a stop token
    fast, slow = OutputProcessor(tok), GeneralOutputs(tok)
    deltas: list[list[CompletionDelta | None]] = [[], []]
    for proc, got in zip((fast, slow), deltas, strict=True):
        req = Request("a", [1, 2, 3], SamplingParams(), 0.0)
        proc.add(req)
        for i, t in enumerate(ids):
            req.output_token_ids.append(t)
            last = i == len(ids) - 1
            upd = RequestUpdate("a", [t], last, "stop" if last else None, t if last else None)
            got.append(proc.process(req, upd, TokenLogprob(t, -0.5) if i % 3 == 0 else None))
    assert deltas[0] == deltas[1]
    assert "".join(d.new_text for d in deltas[0] if d) == "héllo — 你好 🙂🙂 Здравствуй, world"
    assert [d.finished for d in deltas[0] if d] == [False] * (len(ids) - 1) + [True]


def test_token_at_is_token_slice_of_one() -> None:
    req = Request("a", [10, 11, 12], SamplingParams(), 0.0, output_token_ids=[20, 21], num_pending=1)
    assert [req.token_at(i) for i in range(req.num_tokens)] == req.token_slice(0, req.num_tokens)
    assert req.token_at(5) == PENDING_TOKEN
