"""EAGLE3 drafts (model/eagle3.py, model/eagle3_weights.py): the published layouts load to the same
draft, anything that does not fit the target is named, and the draft's paged forward computes the
published equations (checked against a dense implementation of them written out here)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from osserve.config import preset
from osserve.errors import CheckpointError, ConfigError
from osserve.model.eagle3 import Eagle3Config, default_aux_layers
from osserve.model.eagle3_weights import draft_config_for, load_draft, random_draft, write_random_draft
from osserve.ops.attention.kv_format import KVCache
from osserve.ops.attention.metadata import AttentionMetadata, BlockTables

TARGET = preset("tiny")
SMALL = Eagle3Config(hidden_size=128, intermediate_size=256, num_attention_heads=8, num_key_value_heads=1, head_dim=64,
                     vocab_size=TARGET.vocab_size, draft_vocab_size=4096, aux_layer_ids=(1, 2, 3))


@pytest.fixture(scope="module")
def specforge(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_draft(TARGET, tmp_path_factory.mktemp("draft"), seed=3, cfg=SMALL)


def rewrite(src: Path, dst: Path, config: dict, prefixes: dict[str, str] | None = None,
            drop: tuple[str, ...] = (), add: dict[str, torch.Tensor] | None = None) -> Path:
    """The draft at src saved again: names starting with a key of `prefixes` given its value instead."""
    dst.mkdir(parents=True, exist_ok=True)
    tensors = {k: v for k, v in load_file(str(src / "model.safetensors")).items() if k not in drop}
    for old, new in (prefixes or {}).items():
        tensors = {new + k[len(old):] if k.startswith(old) else k: v for k, v in tensors.items()}
    save_file({**tensors, **(add or {})}, str(dst / "model.safetensors"))
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def params(draft: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v for k, v in draft.state_dict().items() if not k.startswith(("input_norm", "embed_tokens"))}


def test_the_three_layouts_load_to_the_same_draft(specforge: Path, tmp_path: Path) -> None:
    config = json.loads((specforge / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 4096
    base = load_draft(specforge, TARGET, torch.device("cpu"), torch.float32)
    assert base.config.aux_layer_ids == (1, 2, 3) and base.lm_head is not None and base.embed_tokens is None
    # ModelOpt: no t2d, and a `model.`-prefixed export is read too
    modelopt = rewrite(specforge, tmp_path / "modelopt", config, {"": "model."}, drop=("t2d",))
    assert all(k.startswith("model.") for k in load_file(str(modelopt / "model.safetensors")))
    assert params(load_draft(modelopt, TARGET, torch.device("cpu"), torch.float32)).keys() == params(base).keys()
    # speculators: the Llama config nested, layers.0.*, gpt-oss's input_norm over fc's input, its own embedding
    nested = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "draft_vocab_size": 4096,
              "norm_before_fc": True, "eagle_aux_hidden_state_layer_ids": [1, 2, 3],
              "transformer_layer_config": {k: v for k, v in config.items() if k not in ("eagle_config",
                                                                                    "draft_vocab_size")}}
    extra = {"input_norm.weight": torch.ones(3 * 128, dtype=torch.bfloat16),
             "embed_tokens.weight": torch.zeros(TARGET.vocab_size, 128, dtype=torch.bfloat16)}
    spec = rewrite(specforge, tmp_path / "speculators", nested, {"midlayer.": "layers.0."}, add=extra)
    loaded = load_draft(spec, TARGET, torch.device("cpu"), torch.float32)
    assert loaded.input_norm is not None and loaded.embed_tokens is not None
    for name, tensor in params(base).items():
        assert torch.equal(params(loaded)[name], tensor), name
    # NVIDIA's Eagle3-v2: no fc (the target's last hidden state), the full vocabulary, the target's head
    v2 = dict(config, eagle_config={"use_aux_hidden_state": False}, draft_vocab_size=None)
    head_less = rewrite(specforge, tmp_path / "v2", v2, drop=("fc.weight", "lm_head.weight", "d2t", "t2d"))
    draft = load_draft(head_less, TARGET, torch.device("cpu"), torch.float32)
    assert draft.fc is None and draft.lm_head is None and draft.d2t is None and draft.config.aux_layer_ids == ()


def test_what_does_not_fit_is_named(specforge: Path, tmp_path: Path) -> None:
    config = json.loads((specforge / "config.json").read_text())
    cpu = torch.device("cpu")

    def fails(folder: Path, error: type[Exception], *words: str) -> None:
        with pytest.raises(error) as e:
            load_draft(folder, TARGET, cpu, torch.float32)
        assert all(w in str(e.value) for w in words), str(e.value)

    fails(rewrite(specforge, tmp_path / "h", dict(config, hidden_size=256)), ConfigError, "hidden_size", "256", "128")
    fails(rewrite(specforge, tmp_path / "v", dict(config, vocab_size=32000)), ConfigError, "vocab_size", "201088")
    fails(rewrite(specforge, tmp_path / "l", dict(config, num_hidden_layers=2)), ConfigError, "num_hidden_layers")
    fails(rewrite(specforge, tmp_path / "a", dict(config, architectures=["GptOssForCausalLMEagle3"])), ConfigError,
          "architectures")
    fails(rewrite(specforge, tmp_path / "m", dict(config, eagle_config={"use_mtp_layernorm": True})), ConfigError,
          "use_mtp_layernorm")
    fails(rewrite(specforge, tmp_path / "i", dict(config, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 9]})),
          ConfigError, "eagle_aux_hidden_state_layer_ids")
    fails(rewrite(specforge, tmp_path / "u", config, add={"midlayer.extra_proj.weight": torch.zeros(2)}),
          CheckpointError, "midlayer.extra_proj.weight")
    fails(rewrite(specforge, tmp_path / "x", config, drop=("midlayer.hidden_norm.weight",)), CheckpointError,
          "missing", "midlayer.hidden_norm.weight")
    fails(rewrite(specforge, tmp_path / "s", config, add={"fc.weight": torch.zeros(128, 128)}), CheckpointError,
          "fc.weight", "(128, 128)", "(128, 384)")
    fails(rewrite(specforge, tmp_path / "d", config, add={"d2t": torch.full((4096,), 10**6)}), CheckpointError, "d2t")
    fails(rewrite(specforge, tmp_path / "t", config, add={"t2d": torch.zeros(TARGET.vocab_size, dtype=torch.bool)}),
          CheckpointError, "t2d")
    fails(rewrite(specforge, tmp_path / "n", config, drop=("lm_head.weight",)), CheckpointError, "lm_head")


def test_published_shapes_and_default_layers() -> None:
    for name, layers in (("20b", (1, 11, 21)), ("120b", (1, 17, 33))):
        cfg = draft_config_for(preset(name))  # SpecForge's configs/gpt-oss-*-eagle3.json
        assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                cfg.head_dim, cfg.draft_vocab_size, cfg.aux_layer_ids) == (2880, 17280, 64, 8, 64, 32000, layers)
        assert cfg.q_size == 4096  # q_proj [4096, 5760]
    assert default_aux_layers(24) == (1, 11, 20) and default_aux_layers(36) == (1, 17, 32)  # SpecForge's default


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = pos.float()[:, None] * inv[None, :]
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    a, b = x.chunk(2, dim=-1)
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))


def dense_draft(t: dict[str, torch.Tensor], tokens: torch.Tensor, aux: torch.Tensor, embedding: torch.Tensor,
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """SpecForge's LlamaForCausalLMEagle3 on one sequence at positions 0..T-1: (logits, prenorm)."""
    m = "midlayer."
    h = aux @ t["fc.weight"].T
    x = torch.cat([rms(embedding[tokens], t[m + "input_layernorm.weight"]), rms(h, t[m + "hidden_norm.weight"])], -1)
    n = len(tokens)
    q = (x @ t[m + "self_attn.q_proj.weight"].T).view(n, 8, 64)
    k = (x @ t[m + "self_attn.k_proj.weight"].T).view(n, 1, 64)
    v = (x @ t[m + "self_attn.v_proj.weight"].T).view(n, 1, 64)
    pos = torch.arange(n)
    q, k = rope(q, pos), rope(k, pos)
    scores = torch.einsum("qhd,khd->hqk", q, k.expand(n, 8, 64)) / math.sqrt(64)
    scores = scores.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
    o = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v.expand(n, 8, 64)).reshape(n, 512)
    r = h + o @ t[m + "self_attn.o_proj.weight"].T
    y = rms(r, t[m + "post_attention_layernorm.weight"])
    pre = r + (F.silu(y @ t[m + "mlp.gate_proj.weight"].T) * (y @ t[m + "mlp.up_proj.weight"].T)) @ \
        t[m + "mlp.down_proj.weight"].T
    return rms(pre, t["norm.weight"]) @ t["lm_head.weight"].T, pre


def test_paged_forward_computes_the_published_layer(specforge: Path) -> None:
    """Two chunks over the paged cache (the second reads the first's KV) = the dense layer."""
    draft = load_draft(specforge, TARGET, torch.device("cpu"), torch.float32)
    embedding = torch.randn(TARGET.vocab_size, 128, generator=torch.Generator().manual_seed(1))
    draft.attach(embedding, torch.zeros(1), max_positions=64)
    tensors = {k: v.float() for k, v in load_file(str(specforge / "model.safetensors")).items()}
    n, bs = 23, 4
    g = torch.Generator().manual_seed(2)
    tokens, aux = torch.randint(0, 1000, (n,), generator=g), torch.randn(n, 3 * 128, generator=g)
    logits, pre = dense_draft(tensors, tokens, aux, embedding)
    kv = KVCache(torch.zeros(10, bs, 1, 64), torch.zeros(10, bs, 1, 64))
    table = torch.tensor([[7, 2, 9, 0, 5, 1]], dtype=torch.int32)  # 6 blocks in shuffled order
    for lo, hi in ((0, 15), (15, n)):
        pos = torch.arange(lo, hi)
        slots = table[0, pos // bs].long() * bs + pos % bs
        meta = AttentionMetadata(torch.tensor([0, hi - lo], dtype=torch.int32), torch.tensor([hi], dtype=torch.int32),
                                 [hi - lo], [hi], {"full": BlockTables(table, slots)})
        normed, prenorm = draft(tokens[lo:hi], draft.project(aux[lo:hi]), pos, meta, kv)
        assert torch.allclose(prenorm, pre[lo:hi], atol=1e-4, rtol=1e-4)
        assert torch.allclose(draft.logits(normed), logits[lo:hi], atol=1e-3, rtol=1e-4)
    # d2t: draft ids to the target's
    assert draft.d2t is not None
    ids = torch.tensor([0, 5, 4095])
    assert torch.equal(draft.to_target(ids), ids + draft.d2t[ids])


def test_dummy_draft_is_the_written_one() -> None:
    a = random_draft(TARGET, 3, torch.device("cpu"), torch.float32, SMALL)
    b = random_draft(TARGET, 3, torch.device("cpu"), torch.float32, SMALL)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_checkpoint_command_writes_a_draft_the_llm_serves(tiny_checkpoint: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from osserve import LLM, SamplingParams, cli

    assert cli.main(["checkpoint", "--preset", "eagle3", "--target", str(tiny_checkpoint), "--out",
                     str(tmp_path / "d"), "--seed", "4"]) == 0
    assert "random EAGLE3 draft" in capsys.readouterr().out
    assert cli.main(["checkpoint", "--preset", "eagle3", "--out", str(tmp_path / "e")]) == 1
    assert "--preset eagle3 needs --target" in capsys.readouterr().err
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    spec = LLM(model=str(tiny_checkpoint), device="cpu", max_model_len=256,
               speculative_config={"method": "eagle3", "model": str(tmp_path / "d"), "topk": 2,
                                   "num_draft_tokens": 5})
    plain = LLM(model=str(tiny_checkpoint), device="cpu", max_model_len=256)
    assert [o.token_ids for o in spec.generate([[1, 2, 3], [7] * 20], params)] == \
        [o.token_ids for o in plain.generate([[1, 2, 3], [7] * 20], params)]
    assert spec.engine.stats().spec_num_drafts > 0
