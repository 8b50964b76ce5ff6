"""The built-in model's EAGLE3 draft: its trainer computes what the served draft computes, and the
shipped draft speculates losslessly with the acceptance length README states."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from osserve.demo.draft_compact import expand_draft, save_draft
from osserve.demo.draft_eval import CONFIGS, measure
from osserve.demo.train_draft import DraftTrainConfig, DraftTrainer, batches, draft_tensors, make_batch, precompute
from osserve.demo.trainable import trainable_from_compact
from osserve.demo.weights import DEMO_DRAFT, DEMO_WEIGHTS
from osserve.model.eagle3_weights import load_draft
from osserve.model.gpt_oss import FULL_GROUP
from osserve.ops.attention.kv_format import KVCache
from osserve.ops.attention.metadata import AttentionMetadata, BlockTables

# The shipped draft's mean acceptance length on 16 held-out prompts (python -m osserve.demo.draft_eval
# --n 16, greedy, on this CPU): the test asserts a little less on its 3 prompts.
SHIPPED_CHAIN_AL = 3.43


def test_the_trainer_computes_what_the_served_draft_computes(tmp_path: Path) -> None:
    """Step 1 of the training-time test (dense, autograd) against the served draft (paged cache,
    serving ops) on the same weights and the same target states."""
    cfg = DraftTrainConfig(out="", examples=2, device="cpu")
    target = trainable_from_compact(str(DEMO_WEIGHTS))
    trainer = DraftTrainer(target, cfg)
    with torch.no_grad():  # the weights as the shipped file holds them (bf16), on both sides
        for p in trainer.draft.parameters():
            p.copy_(p.bfloat16().float())
    examples = precompute(trainer, *batches(cfg, target.vocab), "cpu")
    batch = make_batch(examples[:1], cfg.ttt, "cpu")
    kept: list[torch.Tensor] = []
    with torch.no_grad():
        trainer.loss(batch, kept)
    folder = expand_draft(save_draft(draft_tensors(trainer), trainer.cfg.to_dict(), tmp_path / "d.safetensors", {}),
                          tmp_path / "d")
    served = load_draft(folder, target.served_config, torch.device("cpu"), torch.float32)
    full_embedding = torch.zeros(target.served_config.vocab_size, trainer.cfg.hidden_size)
    full_embedding[torch.tensor(target.vocab)] = target.net.model.embed_tokens.weight.float()
    served.attach(full_embedding, torch.zeros(1), max_positions=1024)
    ex = examples[0]
    n = len(ex.ids)
    tokens = torch.tensor(target.vocab)[ex.ids[1:]]  # row p holds the token at p + 1
    table = torch.arange((n + 15) // 16, dtype=torch.int32)[None]
    pos = torch.arange(n - 1)
    kv = KVCache(torch.zeros(table.shape[1], 16, 2, 64), torch.zeros(table.shape[1], 16, 2, 64))
    meta = AttentionMetadata(torch.tensor([0, n - 1], dtype=torch.int32), torch.tensor([n - 1], dtype=torch.int32),
                             [n - 1], [n - 1], {FULL_GROUP: BlockTables(table, pos)})
    with torch.no_grad():
        normed, _ = served(tokens, served.project(ex.aux[: n - 1].float()), pos, meta, kv)
        logp = served.logits(normed).log_softmax(-1)
    rows = batch.rows[0]
    valid = rows < n - 1
    assert torch.allclose(logp[rows[valid]], kept[0][0][valid].float(), atol=1e-4)


@pytest.mark.skipif(not DEMO_DRAFT.is_file(), reason="this build ships no demo draft")
def test_the_shipped_draft_is_lossless_and_accepts_what_readme_says() -> None:
    reports = {r.name: r for r in measure(None, 3, "cpu", max_tokens=96,
                                          configs={k: CONFIGS[k] for k in ("eagle3 chain", "ngram")})}
    for r in reports.values():
        assert r.identical == r.prompts, r
    assert reports["eagle3 chain"].acceptance_length >= SHIPPED_CHAIN_AL - 0.4, reports
    assert reports["ngram"].acceptance_length > 1.2, reports
