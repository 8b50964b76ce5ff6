"""The built-in model's draft at work: `python -m osserve.demo.draft_eval [--draft FILE] [--n 48]
[--device cuda]`.

Held-out prompts (demo/evaluate.py's), greedy, through the built-in model without speculation and
with it (the draft as an EAGLE3 chain and tree, and prompt lookup); prints for each the mean
acceptance length (1 + accepted drafts / drafts verified, vLLM's) and whether every output equals
the plain one (it must: speculation is lossless). The shipped draft by default, or a file that
demo/train_draft.py wrote.
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osserve.demo.compact import corpus_version
from osserve.demo.draft_compact import expand_draft
from osserve.demo.evaluate import heldout_examples
from osserve.demo.weights import DEMO_WEIGHTS
from osserve.engine.core.sampling_params import SamplingParams
from osserve.harmony.render import render_chat

CONFIGS: dict[str, dict[str, Any]] = {
    "eagle3 chain": {"method": "eagle3", "num_speculative_tokens": 3},
    "eagle3 tree": {"method": "eagle3", "num_speculative_tokens": 4, "topk": 3, "num_draft_tokens": 10},
    "ngram": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4},
}


@dataclass
class DraftReport:
    name: str
    acceptance_length: float
    identical: int
    prompts: int


def prompts(n: int) -> list[list[int]]:
    """n held-out prompts of the corpus the built-in model (the draft's target) learned."""
    examples = heldout_examples(n, effort=None, version=corpus_version(DEMO_WEIGHTS))
    return [render_chat(ex.messages, tools=ex.tools, reasoning_effort=ex.effort).token_ids for ex in examples]


def generate(llm: Any, ps: list[list[int]], max_tokens: int) -> list[list[int]]:
    outs = llm.generate(ps, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    return [o.token_ids for o in outs]


def measure(draft: Path | None, n: int, device: str | None, max_tokens: int = 160,
            configs: dict[str, dict[str, Any]] = CONFIGS) -> list[DraftReport]:
    """Each config's acceptance length on n held-out prompts, and how many outputs equal plain decoding's."""
    from osserve.engine.llm import LLM

    ps = prompts(n)
    plain = generate(LLM(device=device, max_model_len=1024), ps, max_tokens)
    reports = []
    for name, cfg in configs.items():
        cfg = dict(cfg, model=str(draft)) if draft is not None and cfg["method"] == "eagle3" else cfg
        llm = LLM(device=device, max_model_len=1024, speculative_config=cfg)
        got = generate(llm, ps, max_tokens)
        spec = llm.engine.spec
        assert spec is not None
        reports.append(DraftReport(name, spec.stats.mean_acceptance_length,
                                   sum(a == b for a, b in zip(got, plain, strict=True)), len(ps)))
    return reports


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--draft", default=None, help="a draft file (demo/train_draft.py's); default: the shipped one")
    p.add_argument("--n", type=int, default=48)
    p.add_argument("--device", default=None)
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = expand_draft(a.draft, tmp) if a.draft else None
        for r in measure(folder, a.n, a.device):
            print(f"{r.name}: mean acceptance length {r.acceptance_length:.2f}; outputs equal to plain decoding: "
                  f"{r.identical}/{r.prompts}", flush=True)


if __name__ == "__main__":
    main()
