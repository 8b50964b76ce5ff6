"""The demo model's training form computes what the served checkpoint computes."""

from __future__ import annotations

from pathlib import Path

import torch

from osserve.config import ModelConfig
from osserve.demo.compact import expand_compact, save_compact
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
