"""Assembling speculative decoding from its config: the draft model (EAGLE3) or the n-gram
proposer, the draft's KV cache on the target's full-attention blocks, and the decoder the engine
steps with. engine/load.py calls these in order: `load_draft` before the KV plan (the draft's
cache takes part of the budget), `make_decoder` once the target's cache exists."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from osserve.config import ModelConfig
from osserve.engine.worker.kv_tensors import KVPlan
from osserve.engine.worker.runner import ModelRunner
from osserve.engine.worker.verify_graphs import VerifyGraphs
from osserve.errors import ConfigError
from osserve.model.eagle3 import Eagle3Draft
from osserve.model.eagle3_weights import load_draft, random_draft
from osserve.model.gpt_oss import FULL_GROUP, GptOssForCausalLM, KVCache
from osserve.model.resolve import resolve_model
from osserve.speculative.config import SpeculativeConfig
from osserve.speculative.decoder import SpeculativeDecoder
from osserve.speculative.eagle import Eagle3Proposer
from osserve.speculative.eagle_graphs import DraftGraphs
from osserve.speculative.ngram import NgramProposer

log = logging.getLogger("osserve")


def check_draft_folder(folder: Path) -> None:
    if not (folder / "config.json").is_file():
        raise ConfigError(f"{folder}: not an EAGLE3 draft (no config.json)", "speculative_config.model")
    try:
        json.loads((folder / "config.json").read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{folder}/config.json is not valid JSON: {e}", "speculative_config.model") from e


def draft_for(spec: SpeculativeConfig, target: GptOssForCausalLM, device: torch.device, dtype: torch.dtype,
              dummy: bool, seed: int, builtin: Path | None, max_positions: int) -> Eagle3Draft | None:
    """The EAGLE3 draft, ready to run (None for ngram): random with `dummy`, the built-in model's
    shipped draft (`builtin`) where speculative_config names no model, else the named one."""
    if spec.method != "eagle3":
        return None
    cfg = target.config
    if dummy:
        draft = random_draft(cfg, seed, device, dtype)
    elif spec.model is not None:
        folder = resolve_model(spec.model, check=check_draft_folder).path
        draft = load_draft(folder, cfg, device, dtype)
    elif builtin is not None:
        draft = load_draft(builtin, cfg, device, dtype)
    else:
        raise ConfigError("--speculative-config: 'model' is required for method eagle3 (an EAGLE3 draft folder or "
                          "Hugging Face id, such as lmsys/EAGLE3-gpt-oss-120b-bf16)", "speculative_config.model")
    draft.attach(target.model.embed_tokens.weight, target.lm_head.weight, max_positions)
    return draft


def draft_kv_bytes(draft: Eagle3Draft | None, block_size: int, dtype: torch.dtype) -> int:
    """The draft's KV bytes per full-attention block (one layer, its own kv heads)."""
    if draft is None:
        return 0
    return 2 * block_size * draft.config.kv_size * dtype.itemsize


def make_decoder(spec: SpeculativeConfig, cfg: ModelConfig, draft: Eagle3Draft | None, plan: KVPlan,
                 runner: ModelRunner, dtype: torch.dtype, max_model_len: int) -> SpeculativeDecoder:
    proposer: Eagle3Proposer | NgramProposer
    if draft is None:
        proposer = NgramProposer(spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max)
    else:
        if FULL_GROUP not in plan.num_blocks:
            raise ConfigError("EAGLE3 drafts need a model with full-attention layers", "speculative_config")
        # In the model's dtype even beside an FP8 cache (--kv-cache-dtype fp8): one layer's worth, and
        # its attention stays the plain path.
        kv = KVCache.allocate(plan.num_blocks[FULL_GROUP], plan.block_size, draft.config.num_key_value_heads,
                              draft.config.head_dim, dtype, runner.device)
        runner.extra_caches[FULL_GROUP] = [kv]
        proposer = Eagle3Proposer(draft, kv, plan.block_size, spec, runner.device)
    return SpeculativeDecoder(spec, proposer, cfg.vocab_size, max_model_len)


def capture_speculative_graphs(decoder: SpeculativeDecoder, runner: ModelRunner, groups: list[str],
                               max_positions: int, max_batch: int, dtype: torch.dtype) -> None:
    """CUDA graphs for steady speculative steps: the target's verify forward (engine/worker/
    verify_graphs.py) and the EAGLE3 draft's passes (speculative/eagle_graphs.py), in the decode
    graphs' memory pool. A capture that fails leaves those steps eager, with a warning: slower,
    still correct."""
    spec = decoder.config
    pool = runner.graphs.pool if runner.graphs is not None else None
    try:
        graphs = VerifyGraphs(runner.model, runner.kv_caches, groups, runner.block_size, max_positions, max_batch,
                              spec.num_draft_tokens, spec.is_tree, decoder.capture_layers)
        pool = graphs.capture(pool)
        runner.verify_graphs = graphs
        proposer = decoder.proposer
        if isinstance(proposer, Eagle3Proposer):
            width = 3 * runner.model.config.hidden_size if decoder.capture_layers else runner.model.config.hidden_size
            draft_graphs = DraftGraphs(proposer, max_batch, spec.num_draft_tokens, max_positions, width, dtype)
            draft_graphs.capture(pool)
            proposer.graphs = draft_graphs
    except Exception as e:  # noqa: BLE001 - any capture failure: run these steps eagerly
        runner.verify_graphs = None
        if isinstance(decoder.proposer, Eagle3Proposer):
            decoder.proposer.graphs = None
        log.warning("speculative steps run eagerly: capturing their CUDA graphs failed (%s: %s)", type(e).__name__, e)
