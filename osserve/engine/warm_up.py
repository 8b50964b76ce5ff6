"""Warming a GPU engine up before it serves: its kernels run once, so that the first users'
prompts do not wait for Triton to compile them (the first wave of a 256-stream benchmark waited
3.5 s for its first tokens).

- First, a prompt bound to a JSON object for each mask lane (structured/matchers.py), so that each
  lane's copy of that grammar is compiled and step 2's short prompts join their step at once.
- Step 1: prompts filling the token budget, none longer than a context: two short ones and as many
  whole contexts as fit (above 4096 tokens a step takes the dense MoE path where it repays:
  moe/dispatch.py's dense_repays; else the Gluon kernel in chunks). With one prompt of a
  context (4,094 tokens under the benchmarks' --max-model-len 4096) a step never reached that path
  here, and the first wave of a 1k-token benchmark met it cold: its 16-prompt steps' TTFT p99 was
  9.5 s on a fresh machine against 6.2-6.3 on a warm one (H100, 2026-11-27). With this step it
  was still 8.2 s: what the first wave compiled then is in step 2.
- Step 2: their decodes beside short prompts and one longer than a mixed-step graph takes, added
  after step 1 so that they cannot join it: an eager mixed step (the swapped MoE kernel, attention
  split between the decode and prefill kernels). Without it, the first wave of a 1k-token
  benchmark compiled that split and its TTFT p99 grew by ~6 s (H100, 2026-11-27). The new prompts
  sample at temperature 1, the short ones bound to a JSON object, and the step samples more rows
  than the small-batch logits kernel takes (SMALL_M_TOKENS): the sampling and mask kernels then
  read bf16 logits, as at serving batches, not float32 (a 20b server compiled the sampling kernel
  for the first wave, and the mask kernel for the first schema-bound batch: H100, 2026-11-27,
  compile_log.py's warning).
- Then one prompt alone.

A kernel compiled after it is logged as a warning (compile_log.py), with what sets it apart from
the warm-up's compiles of that kernel.

The short prompts and the lone one sample at temperature 1, as the server's requests do by
default: the first request after start-up, alone and sampled, otherwise compiled the one-row
logits projection and the sampling kernel (~1.1 s at 120b). The first prompts' answers are bound
to a JSON object, and so is the lone one's: the grammar library's tokenizer, the first compile and
the mask kernel are built here, not for the first structured requests (H100, 2026-11-25: the
first round of 1,024 schema-bound requests at c=256 had a TTFT p90 of 3.7-4.4 s, the next 0.37 s).

Leaves no request and no statistics behind; the prompts' blocks and the grammar stay cached.
"""

from __future__ import annotations

from itertools import count
from typing import TYPE_CHECKING

from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.worker.mixed_graphs import QUERY_BUCKETS
from osserve.ops.linear.small_m_triton import MAX_TOKENS as SMALL_M_TOKENS
from osserve.structured.spec import StructuredOutputs

if TYPE_CHECKING:
    from osserve.engine.engine import LLMEngine

# (prompt tokens, max_tokens, temperature, answer bound to a JSON object)
WarmUpRequest = tuple[int, int, float, bool]


def warm_up(engine: LLMEngine) -> None:
    """Run the steps the module docstring lists, then forget their counts."""
    engine.grammars.prepare()
    budget = engine.scheduler_config.max_num_batched_tokens
    longest = engine.max_model_len - 2  # a prompt that leaves room for its two tokens out
    short = max(1, min(100, min(budget, longest) // 4))
    fill = budget - 2 * short
    ids = count()

    def add(requests: list[WarmUpRequest]) -> None:
        for n, out, temperature, json_answer in requests:
            i = next(ids)  # distinct prompts: none may be served from another's cached prefix
            structured = StructuredOutputs(json_object=True) if json_answer else None
            engine.add_request(f"warm-up-{i}", [(7 * t + 101 * i) % 1000 for t in range(n)],
                               SamplingParams(temperature=temperature, max_tokens=out, ignore_eos=True,
                                              structured=structured))

    def run_to_end() -> None:
        while engine.has_unfinished():
            engine.step()

    add([(41, 2, 1.0, True)] * engine.grammars.compiler.num_lanes)
    run_to_end()
    whole, rest = divmod(fill, longest)
    first = ([(longest, 2, 0.0, False)] * whole + [(rest, 2, 0.0, False)] * (rest > 0)
             + [(short, 2, 0.0, False), (short, 2, 0.0, False)])
    add(first)
    engine.step()
    # With the long one, more rows than SMALL_M_TOKENS, where the sequence cap lets all in one step.
    # The short ones are JSON-bound: their grammar's lanes are compiled, so they join this step.
    decoding = len(first)
    seqs = engine.scheduler_config.max_num_seqs
    short_sampled = max(7, min(SMALL_M_TOKENS - decoding, seqs - decoding - 1))
    add([(37, 1, 1.0, True)] * short_sampled
        + [(min(QUERY_BUCKETS[-1] + 1, min(budget, longest) // 2), 1, 1.0, False)])
    run_to_end()
    add([(41, 2, 1.0, True)])
    run_to_end()
    engine.reset_stats()
