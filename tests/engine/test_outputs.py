"""Coalescing deltas: a consumer that fell behind gets one delta with everything that waited."""

from __future__ import annotations

import asyncio

from osserve.engine.core.outputs import CompletionDelta, TokenLogprob, coalesce


def delta(i: int, finished: bool = False) -> CompletionDelta:
    return CompletionDelta(request_id="r", new_token_ids=[i], new_text=f"<{i}>", new_logprobs=[TokenLogprob(i, -i)],
                           finished=finished, finish_reason="length" if finished else None, stop_reason=None,
                           num_prompt_tokens=5, num_cached_tokens=0, num_output_tokens=i + 1,
                           queue_time=0.5 if i == 0 else None)


def test_coalesce_joins_what_waits_and_stops_at_the_last() -> None:
    async def run() -> tuple[CompletionDelta, CompletionDelta, CompletionDelta]:
        q: asyncio.Queue[CompletionDelta] = asyncio.Queue()
        for i in range(1, 4):
            q.put_nowait(delta(i, finished=i == 3))
        q.put_nowait(delta(9))  # never happens for one request; proves coalesce stops at the last
        first = coalesce(delta(0), q)
        alone = coalesce(q.get_nowait(), q)
        q2: asyncio.Queue[CompletionDelta] = asyncio.Queue()
        return first, alone, coalesce(delta(7), q2)

    first, alone, single = asyncio.run(run())
    assert first.new_token_ids == [0, 1, 2, 3] and first.new_text == "<0><1><2><3>"
    assert [lp.token_id for lp in first.new_logprobs or []] == [0, 1, 2, 3]
    assert first.finished and first.finish_reason == "length" and first.num_output_tokens == 4
    assert first.queue_time == 0.5
    assert alone.new_token_ids == [9]
    assert single.new_token_ids == [7] and not single.finished
