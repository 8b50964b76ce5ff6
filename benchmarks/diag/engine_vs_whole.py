"""Is a one-GPU engine's model the model its dummy weights describe? (2 x H200, 2026-11-26:
tp_bench.py's TP 1 and TP 2 rows parted at every prompt's first token, while TP 2 matched a
freshly filled whole model's float32 reference in tests/gpu/test_tp_gpu.py, and test_model_gpu.py
compares the engine only with its own model.) Builds the engine on the dummy weights and, beside
it, a whole model filled with the same seed; prints the checkpoint tensors that differ and each
prompt's last-row logits through the reference ops of both models and through the engine.

    python3 benchmarks/diag/engine_vs_whole.py --preset 20b

Found (H100, 1b99bac): identical tensors, yet last-row logits 52% and 73% apart on 2 of 4 prompts
through the same reference ops (the fused q/k/v GEMM against three): the random 20b is
ill-conditioned in bf16 (history file, "Tensor parallelism on 2 GPUs").
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.tp_bench import prompts
from osserve.config import preset
from osserve.engine.load import EngineArgs, build_engine
from osserve.model.checkpoint import fill_random_weights
from osserve.model.weights import build_model
from tests.gpu.test_model_gpu import greedy, reference_logits
from tests.ops.attention_cases import rel_err


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="20b")
    args = ap.parse_args()
    cfg = preset(args.preset)
    engine = build_engine(EngineArgs(load_format="dummy", preset=args.preset, max_model_len=4096, max_num_seqs=64,
                                     kv_cache_gb=2))
    model = engine.runner.model
    whole = build_model(cfg, model.lm_head.weight.device, model.lm_head.weight.dtype)
    fill_random_weights(whole, cfg, seed=0)
    ours = model.state_dict()
    differ = []
    for name, t in whole.state_dict().items():
        o = ours.get(name)
        if o is None or o.shape != t.shape:
            differ.append(f"{name}: {'absent' if o is None else f'shape {tuple(o.shape)} vs {tuple(t.shape)}'}")
        elif not torch.equal(o, t):
            differ.append(f"{name}: {(o.float() - t.float()).abs().max().item():.3g} max abs diff")
    print(f"{len(differ)} of {len(ours)} checkpoint tensors differ from a fresh fill", flush=True)
    for line in differ[:40]:
        print("  ", line, flush=True)
    ps = prompts()[:4]
    tokens = greedy(engine, ps, 2)
    for p, t in zip(ps, tokens, strict=True):
        ref_whole = reference_logits(whole, p)[-1]
        ref_engine = reference_logits(model, p)[-1]
        print(f"prompt of {len(p)}: engine's model vs whole (reference ops) {rel_err(ref_engine, ref_whole):.4f}; "
              f"argmax whole {ref_whole.argmax().item()}, engine's model {ref_engine.argmax().item()}, "
              f"engine greedy {t[0]}", flush=True)


if __name__ == "__main__":
    main()
