"""Where do the fast and reference paths part? Per-layer ‖fast − ref‖/‖ref‖ of each decoder
layer's output on one 300-token prefill (dummy weights), bf16, on the GPU.

A bug shows as a jump at one layer (or one layer type); chaotic amplification of bf16 rounding
by random weights shows as a smooth geometric growth from a small first-layer error."""

from __future__ import annotations

import sys

import torch

from osserve.engine.load import EngineArgs, build_engine
from osserve.ops.dispatch import reference_ops
from tests.model.contiguous import ContiguousCache


def layer_outputs(model, tokens: list[int]) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    outs: list[torch.Tensor] = []
    hooks = [layer.register_forward_hook(lambda m, i, o: outs.append(o[0].float() + o[1].float()))
             for layer in model.model.layers]
    cache = ContiguousCache(model, 1, len(tokens) + 1)
    ids, pos, meta = cache.step([0], [tokens])
    with torch.inference_mode():
        model(ids, pos, meta, cache.kv)
    for h in hooks:
        h.remove()
    return outs


def main() -> None:
    preset = sys.argv[1] if len(sys.argv) > 1 else "20b"
    engine = build_engine(EngineArgs(load_format="dummy", preset=preset, max_model_len=4096, kv_cache_gb=2,
                                     enforce_eager=True))
    model = engine.runner.model
    tokens = torch.randint(0, 199_000, (300,), generator=torch.Generator().manual_seed(0)).tolist()
    fast = layer_outputs(model, tokens)
    with reference_ops():
        ref_bf16 = layer_outputs(model, tokens)
        model.float()
        ref = layer_outputs(model, tokens)  # the reference in float32
    print("layer  type     fast-bf16 vs ref-fp32   ref-bf16 vs ref-fp32   ‖ref‖/√n")
    for i, (f, rb, r) in enumerate(zip(fast, ref_bf16, ref, strict=True)):
        kind = model.config.layer_types[i][:7]
        print(f"{i:5d}  {kind}  {((f - r).norm() / r.norm()).item():20.4g}  {((rb - r).norm() / r.norm()).item():20.4g}"
              f"  {r.norm().item() / r.numel() ** .5:9.3g}")


if __name__ == "__main__":
    main()
