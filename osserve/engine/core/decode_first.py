"""Decode-first: how many prompt tokens a step may take beside the decodes it runs.

A step's time grows with its prompt tokens, and every request decoding in it waits that long for
its next token. Measured on one H100 (issue 38, 20b, 1k-token prompts, 256 streams): with prompts
chunked to the whole --max-num-batched-tokens (8192), the decodes' inter-token latency reached
181 ms at p99, against a decode-only step of ~10 ms (BENCHMARKS.md's c=256 sweep, TPOT p50 9.8 ms).
So the rule: the decodes are scheduled first; while at least `min_decodes` requests decode, the
prompt tokens of a step (prompt chunks, newcomers, preempted requests recomputing) are held to
`chunk`; with fewer decoding, prompts get whatever of the step's budget the decodes leave (a
burst of new prompts is prefilled in large, efficient steps while few would wait for it).

"Few" is by default fewer than three quarters of --max-num-seqs, at most 3/256 of the step budget
(config.default_min_decodes: 192 at 16,384 tokens a step, 96 at 8,192). An ITL percentile counts
every gap of every stream, and a large prompt step lengthens only the gaps of the requests decoding
in it; the 2,048-token chunk's mixed steps prefill at ~55k tok/s against ~71k for 16k-token steps.
Same H100, 20b, the same load (2026-11-27): from 192 decodes of 256 the output was 15,442 / 15,454
tok/s against 14,569-15,029 from 32, with a lower ITL p99 (48 / 52 ms against 51-62) and TTFT p99
(4.1-4.3 s against 5.3-5.9); from 224 and 240 the ITL p99 reached 59 and 64 ms. The budget caps it
because each full-budget step holds up every request already decoding, and a smaller budget takes
more such steps for a burst: the 120b on an H200 (8,192 a step) at 512 streams, from 384 decodes,
had an ITL p99 of 255 ms against 110 from 32.

No request starves: the allowance is never 0 while the decodes leave room in the step, and the
scheduler hands it out first come, first served (a running prompt chunk first, then the queue).

Peers: vLLM's long_prefill_token_threshold caps each request's prompt tokens a step, always;
SGLang's chunked_prefill_size caps a step's prompt tokens, always (with --enable-mixed-chunk the
decodes' tokens come off it). Neither adapts to the decodes running. Plain counts, no tensors.
"""

from __future__ import annotations


def prefill_allowance(step_budget: int, decode_tokens: int, num_decodes: int, chunk: int,
                      min_decodes: int) -> int:
    """The prompt tokens a step may take.

    step_budget: tokens the step may compute in all (--max-num-batched-tokens).
    decode_tokens: what its decodes take (one token each, plus any draft tokens they verify).
    num_decodes: the requests decoding in it.
    chunk: the prompt tokens allowed beside `min_decodes` or more decodes; 0 turns the rule off:
    prompts and decodes then share the budget in the running order, as before the rule
    (the step budget is returned, nothing is set aside for the decodes).
    """
    if chunk <= 0:
        return step_budget
    room = max(0, step_budget - decode_tokens)
    if num_decodes < min_decodes:
        return room
    return min(room, chunk)


def describe(chunk: int, min_decodes: int, step_budget: int) -> str:
    """One line for the start-up log."""
    if chunk <= 0:
        return f"decode-first off: prompts and decodes share {step_budget:,} tokens a step in arrival order"
    return (f"decode-first: at most {min(chunk, step_budget):,} prompt tokens a step while {min_decodes}+ "
            f"requests decode, else up to {step_budget:,}")
