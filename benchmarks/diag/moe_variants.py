"""Diagnostic: decode-logit error vs float32 of the dummy 20b for MoE variants (same engine, same
weights): the default swapped kernel, no K split, and the token-tiled + dense kernels. Run on the
GPU: PYTHONPATH=$PWD python3 benchmarks/diag/moe_variants.py"""

from __future__ import annotations

import torch

import osserve.ops.moe.swapped as moe_swapped
from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.load import EngineArgs, build_engine
from tests.gpu.test_model_gpu import record_logits, reference_logits


def decode_logits(engine, prompt: list[int], steps: int) -> tuple[torch.Tensor, list[int]]:  # type: ignore[no-untyped-def]
    recorded: list[torch.Tensor] = []
    original = engine.runner.run
    record_logits(engine.runner, recorded)
    engine.add_request(f"r{len(prompt)}-{steps}-{id(recorded)}", prompt,
                       SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True))
    out: list[int] = []
    while engine.has_unfinished():
        for d in engine.step():
            out.extend(d.new_token_ids)
    engine.runner.run = original
    return torch.cat(recorded).float(), out


def main() -> None:
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 199_000, (n,), generator=g).tolist() for n in (5, 130, 300, 17, 260, 64)]
    variants = {"default": {}, "no-split": {"PROGRAMS_PER_SM": 0}, "token-tiled": {"MAX_TOKENS": 0}}
    for name, patch in variants.items():  # patched before the build: the CUDA graphs bake them in
        saved = {k: getattr(moe_swapped, k) for k in patch}
        for k, v in patch.items():
            setattr(moe_swapped, k, v)
        engine = build_engine(EngineArgs(load_format="dummy", preset="20b", max_model_len=4096, max_num_seqs=64,
                                         kv_cache_gb=2))
        model = engine.runner.model
        runs = [decode_logits(engine, p, 16) for p in prompts]
        bf16 = [reference_logits(model, p + toks[:-1])[len(p) - 1:].float() for p, (_, toks)
                in zip(prompts, runs, strict=True)]
        model.float()
        errs, ref_errs = [], []
        for p, (fast, toks), rb in zip(prompts, runs, bf16, strict=True):
            ref = reference_logits(model, p + toks[:-1])[len(p) - 1:]
            errs.append(((fast - ref).norm(dim=1) / ref.norm(dim=1)).median().item())
            ref_errs.append(((rb - ref).norm(dim=1) / ref.norm(dim=1)).median().item())
        print(f"{name:12s} fast " + " ".join(f"{e:.3f}" for e in errs) + "  | bf16 ref "
              + " ".join(f"{e:.3f}" for e in ref_errs), flush=True)
        for k, v in saved.items():
            setattr(moe_swapped, k, v)
        del engine, model, runs, bf16
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
