"""Parity with an independent implementation: Hugging Face transformers' GptOssForCausalLM.

Both load the same `tiny` MXFP4 checkpoint, dequantised to float32 on the CPU. Prompts are longer
than the 128-token sliding window, so the window and the sinks both matter. The mutation tests
prove the parity test has teeth: each classic gpt-oss mistake, introduced on purpose, breaks it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import osserve.model.gpt_oss as gpt_oss_module
import osserve.ops.moe.reference as moe_module
import osserve.ops.router.dispatch as router_module
from osserve.model.weights import load_model
from osserve.ops.rope.reference import rope_cos_sin
from tests.model.contiguous import ContiguousCache

PROMPT_LENS = (300, 317, 129)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(1234)
    return [torch.randint(0, 200_000, (n,), generator=g).tolist() for n in PROMPT_LENS]


@pytest.fixture(scope="module")
def hf_model(tiny_checkpoint: Path):  # type: ignore[no-untyped-def]
    transformers = pytest.importorskip("transformers")
    return transformers.GptOssForCausalLM.from_pretrained(
        tiny_checkpoint,
        dtype=torch.float32,
        quantization_config=transformers.Mxfp4Config(dequantize=True),
    ).eval()


@pytest.fixture(scope="module")
def hf_logits(hf_model, prompts: list[list[int]]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    with torch.no_grad():
        return torch.cat([hf_model(torch.tensor([p])).logits[0] for p in prompts])


@pytest.fixture(scope="module")
def model(tiny_checkpoint: Path):  # type: ignore[no-untyped-def]
    return load_model(tiny_checkpoint, "cpu", torch.float32, show_progress=False)


def osserve_logits(model, prompts: list[list[int]]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    cache = ContiguousCache(model, len(prompts), max(map(len, prompts)) + 40)
    ids, pos, meta = cache.step(list(range(len(prompts))), prompts)
    with torch.no_grad():
        return model.compute_logits(model(ids, pos, meta, cache.kv))


def test_prefill_logits_match_transformers(model, prompts, hf_logits) -> None:  # type: ignore[no-untyped-def]
    ours = osserve_logits(model, prompts)
    assert ours.shape == hf_logits.shape
    assert torch.isfinite(ours).all()
    assert (ours - hf_logits).abs().max().item() <= 1e-4


def test_fused_qkv_matches_transformers(tiny_checkpoint: Path, prompts, hf_logits) -> None:  # type: ignore[no-untyped-def]
    """The engine's layout (q, k and v as one GEMM, fuse_qkv at load) computes the same logits,
    and the checkpoint-named tensors still hold the checkpoint's values (as views of the fused)."""
    model = load_model(tiny_checkpoint, "cpu", torch.float32, show_progress=False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.fuse_qkv()
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    attn = model.model.layers[0].self_attn
    assert attn.qkv_weight is not None and attn.q_proj.weight.data_ptr() == attn.qkv_weight.data_ptr()
    ours = osserve_logits(model, prompts)
    assert (ours - hf_logits).abs().max().item() <= 1e-4


def test_greedy_decode_32_tokens_matches_transformers(model, hf_model, prompts) -> None:  # type: ignore[no-untyped-def]
    """Step by step through the KV cache, all prompts in one batch, against HF's generate."""
    steps = 32
    cache = ContiguousCache(model, len(prompts), max(map(len, prompts)) + steps + 1)
    seqs = list(range(len(prompts)))
    chunks = [list(p) for p in prompts]
    outputs: list[list[int]] = [[] for _ in prompts]
    with torch.no_grad():
        for _ in range(steps):
            ids, pos, meta = cache.step(seqs, chunks)
            hidden = model(ids, pos, meta, cache.kv)
            last_rows = meta.query_start_loc[1:].long() - 1
            nxt = model.compute_logits(hidden[last_rows]).argmax(-1).tolist()
            for out, t in zip(outputs, nxt, strict=True):
                out.append(t)
            chunks = [[t] for t in nxt]
        for prompt, ours in zip(prompts, outputs, strict=True):
            ref = hf_model.generate(
                torch.tensor([prompt]), max_new_tokens=steps, do_sample=False,
                min_new_tokens=steps, eos_token_id=None, pad_token_id=0,
            )[0, len(prompt):].tolist()
            assert ours == ref


# ---------------------------------------------------------------- mutation tests
def _no_sink(orig: Callable) -> Callable:
    def f(q, cache, sinks, *a, **kw):  # type: ignore[no-untyped-def]
        return orig(q, cache, torch.full_like(sinks, float("-inf")), *a, **kw)
    return f


def _no_window(orig: Callable) -> Callable:
    def f(q, cache, sinks, meta, tables, scale, window):  # type: ignore[no-untyped-def]
        return orig(q, cache, sinks, meta, tables, scale, None)
    return f


def _halves_not_interleaved(gate_up: torch.Tensor, limit: float) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return gate * torch.sigmoid(gate * moe_module.SWIGLU_ALPHA) * (up + 1)


def _no_clamp(gate_up: torch.Tensor, limit: float) -> torch.Tensor:
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    return gate * torch.sigmoid(gate * moe_module.SWIGLU_ALPHA) * (up + 1)


def _softmax_before_topk(x, weight, bias, top_k, counters=None, plan_block_m=None):  # type: ignore[no-untyped-def]
    probs = torch.softmax(torch.nn.functional.linear(x, weight, bias), dim=-1)
    return (*torch.topk(probs, top_k, dim=-1), None)


MUTATIONS = {
    "sink": (gpt_oss_module, "paged_attention", _no_sink),
    "window": (gpt_oss_module, "paged_attention", _no_window),
    "interleaved_gate_up": (moe_module, "swiglu", lambda orig: _halves_not_interleaved),
    "swiglu_clamp": (moe_module, "swiglu", lambda orig: _no_clamp),
    # the model routes through router.add_norm_route_with_plan, which routes (off CUDA) with this one
    "router_softmax_order": (router_module, "route_with_plan", lambda orig: _softmax_before_topk),
}


@pytest.mark.parametrize("mutation", [*MUTATIONS, "yarn"])
def test_parity_detects_each_classic_mistake(  # type: ignore[no-untyped-def]
    mutation: str, model, prompts, hf_logits, monkeypatch: pytest.MonkeyPatch
) -> None:
    if mutation == "yarn":  # plain RoPE: no frequency interpolation, no concentration
        dim = model.config.head_dim
        plain = 1.0 / (model.config.rope.theta ** (torch.arange(0, dim, 2).float() / dim))
        cos, sin = rope_cos_sin(torch.arange(model.rope_cos.shape[0]), plain, 1.0)
        monkeypatch.setattr(model, "rope_cos", cos)
        monkeypatch.setattr(model, "rope_sin", sin)
    else:
        mod, name, wrap = MUTATIONS[mutation]
        monkeypatch.setattr(mod, name, wrap(getattr(mod, name)))
    diff = (osserve_logits(model, prompts) - hf_logits).abs().max().item()
    assert diff > 1e-2, f"the parity test would not notice a wrong {mutation} (diff {diff})"
