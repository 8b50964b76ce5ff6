"""Speculative steps on the GPU against plain decoding, on the tiny checkpoint: how close each one's
greedy tokens are to the float32 reference (tests/gpu/test_spec_gpu.py's yardstick, over more
prompts and steps than the test takes), and whether a verify step replayed from its CUDA graph
gives the hidden rows that the same step run eagerly gives (the graph's host-side bounds differ:
`VerifyGraphs._meta`). Each speculative kind also runs with the head's logits rounded to bf16
before they are widened ("+bf16 logits": compute_logits before linear_float32).

    PYTHONPATH=$PWD python3 benchmarks/diag/spec_agreement.py [--prompts 16] [--steps 40] [--seeds 2 3]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import torch

from osserve.config import preset
from osserve.engine.load import EngineArgs, build_engine
from osserve.model.checkpoint import write_checkpoint
from osserve.model.eagle3_weights import write_random_draft
from osserve.model.gpt_oss import GptOssForCausalLM
from osserve.ops.linear.dispatch import linear
from osserve.speculative.oracle import AcceptanceOracle
from tests.gpu.test_model_gpu import agreement, greedy

SPECS = {"chain": {"method": "eagle3", "num_speculative_tokens": 3},
         "tree": {"method": "eagle3", "num_speculative_tokens": 3, "topk": 3, "num_draft_tokens": 8}}


def watch_verify_graphs(engine: Any, diffs: list[float]) -> None:
    """After each replay, run the same layout eagerly and keep the largest |difference| of the real
    rows' hidden states (the eager forward writes the same KV again: the same values)."""
    graphs = engine.runner.verify_graphs
    if graphs is None:  # no graphs (a CPU): nothing to compare
        return
    replay = graphs.run

    def run(layout: Any, tables: Any) -> Any:
        hidden, aux = replay(layout, tables)
        kept, captured = hidden.clone(), graphs.captured
        graphs.captured = False
        try:
            eager, _ = replay(layout, tables)
        finally:
            graphs.captured = captured
        real = torch.from_numpy(layout.real).to(kept.device)
        diffs.append((kept[real].float() - eager[real].float()).abs().max().item())
        return kept, aux

    graphs.run = run


float32_logits = GptOssForCausalLM.compute_logits


def bf16_logits(model: GptOssForCausalLM, hidden: torch.Tensor) -> torch.Tensor:
    return linear(hidden, model.lm_head.weight).float()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seeds", type=int, nargs="+", default=[2, 3])
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp())
    checkpoint = write_checkpoint(preset("tiny"), work / "tiny", seed=0, show_progress=False)
    draft = write_random_draft(preset("tiny"), work / "draft", seed=1)
    args = EngineArgs(model=str(checkpoint), max_model_len=4096, kv_cache_gb=1)
    rows = []
    for seed in a.seeds:
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(3, 400, (a.prompts,), generator=g).tolist()
        prompts = [torch.randint(0, 199_000, (n,), generator=g).tolist() for n in lengths]
        plain_engine = build_engine(args)
        plain = greedy(plain_engine, prompts, a.steps)
        model = plain_engine.runner.model
        del plain_engine
        results = {"plain": (plain, None, [])}
        for name, spec, bf16 in [(n, s, b) for n, s in SPECS.items() for b in (False, True)]:
            if bf16:
                name += "+bf16 logits"
                GptOssForCausalLM.compute_logits = bf16_logits  # type: ignore[method-assign]
            engine = build_engine(EngineArgs(**{**vars(args), "speculative_config": dict(spec, model=str(draft))}))
            diffs: list[float] = []
            watch_verify_graphs(engine, diffs)
            engine.spec.oracle = AcceptanceOracle({f"r{i}": t for i, t in enumerate(plain)}, 0.8, 201088)
            results[name] = (greedy(engine, prompts, a.steps), engine.spec.stats.num_accepted_tokens, diffs)
            GptOssForCausalLM.compute_logits = float32_logits  # type: ignore[method-assign]
            del engine
        model.float()
        for name, (tokens, accepted, diffs) in results.items():
            exact, close = agreement(model, prompts, tokens)
            same = sum(x == y for t, p in zip(tokens, plain, strict=True) for x, y in zip(t, p, strict=True))
            graph = f"{len(diffs)} replays, max |graph - eager| {max(diffs):.3g}" if diffs else ""
            rows.append(f"| {seed} | {name} | {exact:.3f} | {close:.3f} | {same / (a.prompts * a.steps):.3f} | "
                        f"{accepted if accepted is not None else ''} | {graph} |")
        del model
        torch.cuda.empty_cache()
    print(f"{a.prompts} prompts x {a.steps} tokens a seed, teacher-forced against the float32 reference")
    print("| seed | decoding | exact (fp32 argmax) | within 0.15 | same as plain | drafts accepted | verify graphs |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
