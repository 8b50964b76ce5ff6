"""The demo model's training form computes what the served checkpoint computes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from osserve.config import ModelConfig
from osserve.demo.compact import compact_vocab, expand_compact, load_trainable, save_compact
from osserve.demo.trainable import DEMO_CONFIG, DemoTrainable, dense_attention
from osserve.model.weights import build_model, load_weights
from osserve.ops.attention.reference import paged_attention_reference
from tests.model.contiguous import ContiguousCache

FULL_VOCAB = 201088


def _trainable(vocab: list[int], seed: int = 0) -> DemoTrainable:
    m = DemoTrainable(DEMO_CONFIG, vocab, FULL_VOCAB)
    m.init_weights(torch.Generator().manual_seed(seed))
    with torch.no_grad():  # give norms, biases and sinks values a zero init would hide
        for name, p in m.named_parameters():
            if name.endswith("bias") or name.endswith("sinks") or "norm" in name:
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.3)
            if name.startswith("gate_up") or name.startswith("down") or "proj.weight" in name:
                p.mul_(20.0)  # activations large enough that the clamp and the router matter
        for p in m.parameters():  # the export rounds to bf16: so do we
            p.copy_(p.to(torch.bfloat16).float())
    m.quantize_experts = True
    return m


def test_dense_attention_is_paged_attention() -> None:
    g = torch.Generator().manual_seed(1)
    b, s, h, kvh, d = 2, 150, 4, 2, 16
    q, k, v = (torch.randn(b, s, n, d, generator=g) for n in (h, kvh, kvh))
    sinks = torch.randn(h, generator=g)
    for window in (None, 128):
        dense = dense_attention(q, k, v, sinks, d**-0.5, window)
        for i in range(b):  # one sequence per block table, 15-token blocks
            kc, vc = k[i].view(-1, 15, kvh, d), v[i].view(-1, 15, kvh, d)
            tables = torch.arange(kc.shape[0], dtype=torch.int32)[None]
            paged = paged_attention_reference(q[i], kc, vc, sinks, [0, s], [s], tables, d**-0.5, window)
            torch.testing.assert_close(dense[i], paged, atol=1e-5, rtol=1e-5)


def test_exported_checkpoint_serves_the_trained_function(tmp_path: Path) -> None:
    vocab = sorted({0, 5, 17, 200006, 200005, 200002, *range(1000, 1300)})
    m = _trainable(vocab)
    compact = save_compact(m, tmp_path / "demo.safetensors", {"seed": "0"})
    assert compact.stat().st_size < 5 * 2**20
    model_dir = expand_compact(compact, tmp_path / "hf")
    cfg = ModelConfig.from_pretrained(model_dir)
    assert cfg.vocab_size == FULL_VOCAB and cfg.num_local_experts == 4
    served = build_model(cfg, "cpu", torch.float32)
    load_weights(served, model_dir, show_progress=False)

    g = torch.Generator().manual_seed(2)
    seqs = [torch.randint(0, len(vocab), (n,), generator=g) for n in (140, 37)]
    cache = ContiguousCache(served, num_seqs=2, max_len=160)
    full_ids = [[vocab[i] for i in s.tolist()] for s in seqs]
    ids, pos, meta = cache.step([0, 1], full_ids)
    with torch.no_grad():
        served_logits = served.compute_logits(served(ids, pos, meta, cache.kv))
        starts = [0, 140]
        for s, start in zip(seqs, starts, strict=True):
            hidden, _ = m(s[None])
            trained = m.net.lm_head(hidden[0])
            got = served_logits[start:start + len(s)]
            torch.testing.assert_close(got[:, vocab], trained, atol=2e-4, rtol=1e-4)
            unused = torch.ones(FULL_VOCAB, dtype=torch.bool)
            unused[vocab] = False
            assert (got[:, unused] == 0).all()  # untrained tokens: exactly logit 0
    # and the check has teeth: without fake quantisation the logits differ visibly
    m.quantize_experts = False
    with torch.no_grad():
        hidden, _ = m(seqs[0][None])
    assert (m.net.lm_head(hidden[0]) - served_logits[:140, vocab]).abs().max() > 1e-2


def test_a_compact_checkpoint_comes_back_in_training_form(tmp_path: Path) -> None:
    """load_trainable inverts save_compact: the same logits over the old tokens, the old rows in
    their order, and new tokens appended with rows of their own."""
    vocab = sorted({0, 5, 17, 200006, 200005, 200002, *range(1000, 1100)})
    m = _trainable(vocab)
    compact = save_compact(m, tmp_path / "demo.safetensors", {"seed": "0"})
    assert compact_vocab(compact) == vocab
    new = [3000, 3001, 42]  # appended as given, after the checkpoint's tokens
    back = load_trainable(compact, vocab + new, torch.Generator().manual_seed(1))
    back.quantize_experts = True
    n = len(vocab)
    assert back.vocab == vocab + new
    torch.testing.assert_close(back.net.model.embed_tokens.weight[:n], m.net.model.embed_tokens.weight)
    torch.testing.assert_close(back.net.lm_head.weight[:n], m.net.lm_head.weight)
    new_embed = back.net.model.embed_tokens.weight[n:]
    assert new_embed.abs().sum(dim=1).min() > 0 and back.net.lm_head.weight[n:].abs().sum(dim=1).min() > 0
    assert torch.cdist(new_embed, back.net.model.embed_tokens.weight[:n]).min() > 1.0  # not copies of old rows
    seq = torch.randint(0, n, (60,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = m.net.lm_head(m(seq[None])[0][0])
        got = back.net.lm_head(back(seq[None])[0][0])
    torch.testing.assert_close(got[:, :n], want, atol=1e-4, rtol=1e-4)
    with pytest.raises(AssertionError, match="start with the checkpoint's"):
        load_trainable(compact, list(reversed(vocab)), torch.Generator())
