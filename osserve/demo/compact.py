"""The demo checkpoint's compact form (what git holds) and its expansion into the Hugging Face layout.

The compact file is one safetensors file with every tensor of the HF gpt-oss layout (bf16 weights,
MXFP4 expert blocks and scales) except that `embed_tokens` and `lm_head` keep only the rows of the
tokens the model was trained on, listed in `vocab` (int64). Expanding scatters those rows into
zero matrices of the full vocabulary and writes config.json + model.safetensors, which the normal
loader reads. A few MB instead of the ~200 MB the two full-vocabulary matrices would take.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from osserve.config import ModelConfig
from osserve.demo.trainable import DemoTrainable
from osserve.model.weights import SINGLE_FILE, checkpoint_layout
from osserve.ops.mxfp4.reference import dequantize_mxfp4, quantize_mxfp4

ROW_TENSORS = ("model.embed_tokens.weight", "lm_head.weight")


def compact_state(model: DemoTrainable) -> dict[str, torch.Tensor]:
    """The trained model as compact-checkpoint tensors (experts quantised to MXFP4)."""
    state = {k: v.detach().float().cpu() for k, v in model.net.state_dict().items()}
    out: dict[str, torch.Tensor] = {"vocab": torch.tensor(model.vocab, dtype=torch.int64)}
    for n in range(model.cfg.num_hidden_layers):
        x = f"model.layers.{n}.mlp.experts."
        for name, w in (("gate_up_proj", model.gate_up[n]), ("down_proj", model.down[n])):
            blocks, scales = quantize_mxfp4(w.detach().float().cpu())
            out[x + name + "_blocks"], out[x + name + "_scales"] = blocks, scales
    for name, (shape, dtype) in checkpoint_layout(model.served_config).items():
        if name in out:
            continue
        t = state[name]
        expected = (len(model.vocab), shape[1]) if name in ROW_TENSORS else shape
        assert tuple(t.shape) == expected, (name, t.shape, expected)
        out[name] = t.to(dtype).contiguous()
    return out


def save_compact(model: DemoTrainable, path: str | Path, metadata: dict[str, str]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"config": json.dumps(model.served_config.to_hf_dict()), **metadata}
    save_file(compact_state(model), str(path), metadata=meta)
    return path


def expand_compact(path: str | Path, out_dir: str | Path) -> Path:
    """Write the full HF checkpoint (config.json + model.safetensors) into out_dir."""
    with safe_open(str(path), framework="pt") as f:
        config = json.loads(f.metadata()["config"])
    tensors = load_file(str(path))
    vocab = tensors.pop("vocab")
    for name in ROW_TENSORS:
        rows = tensors[name]
        full = torch.zeros(config["vocab_size"], rows.shape[1], dtype=rows.dtype)
        full[vocab] = rows
        tensors[name] = full
    return write_folder(out_dir, config, tensors)


def write_folder(out_dir: str | Path, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Path:
    """config.json + model.safetensors in out_dir, the tensors' file renamed into place last: a
    folder that has it is whole. Each file is written under a name of this process's, then renamed:
    two processes expanding at once (two servers, two test runs on a fresh machine) each write
    whole files, and a reader never sees half."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config_tmp = out / f"config.json.{os.getpid()}.tmp"
    config_tmp.write_text(json.dumps(config, indent=2) + "\n")
    os.replace(config_tmp, out / "config.json")
    tmp = out / f"{SINGLE_FILE}.{os.getpid()}.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, out / SINGLE_FILE)
    return out


def corpus_version(path: str | Path) -> int:
    """The corpus a compact checkpoint was trained on (demo/corpus.py); 1 where it does not say."""
    with safe_open(str(path), framework="pt") as f:
        return int((f.metadata() or {}).get("corpus_version", "1"))


def compact_vocab(path: str | Path) -> list[int]:
    """The token ids a compact checkpoint has rows for, in its row order."""
    with safe_open(str(path), framework="pt") as f:
        return [int(t) for t in f.get_tensor("vocab").tolist()]


def load_trainable(path: str | Path, vocab: list[int], generator: torch.Generator) -> DemoTrainable:
    """A compact checkpoint back in training form (float weights, experts dequantised from MXFP4),
    over `vocab`: the checkpoint's tokens first, in its order, then any new ones. A new token's
    embedding is drawn from the old rows' per-dimension mean and spread; its output row is the
    old embedding-to-output map (ridge least squares over the old tokens) applied to that
    embedding, so a token the model only has to copy starts out near what copying it needs."""
    with safe_open(str(path), framework="pt") as f:
        config = ModelConfig.from_dict(json.loads(f.metadata()["config"]))
    tensors = load_file(str(path))
    old = [int(t) for t in tensors.pop("vocab").tolist()]
    assert vocab[: len(old)] == old, "the new vocabulary must start with the checkpoint's, in its order"
    model = DemoTrainable(config, vocab, config.vocab_size)
    model.init_weights(generator)
    n_new = len(vocab) - len(old)
    with torch.no_grad():
        for n in range(config.num_hidden_layers):
            x = f"model.layers.{n}.mlp.experts."
            for name, param in (("gate_up_proj", model.gate_up[n]), ("down_proj", model.down[n])):
                blocks, scales = tensors.pop(x + name + "_blocks"), tensors.pop(x + name + "_scales")
                param.copy_(dequantize_mxfp4(blocks, scales, torch.float32))
        embed, head = tensors.pop(ROW_TENSORS[0]).float(), tensors.pop(ROW_TENSORS[1]).float()
        model.net.model.embed_tokens.weight[: len(old)] = embed
        model.net.lm_head.weight[: len(old)] = head
        if n_new:
            mean, std = embed.mean(0), embed.std(0)
            new_embed = mean + std * torch.randn(n_new, embed.shape[1], generator=generator)
            gram = embed.T @ embed + 1e-2 * len(old) * torch.eye(embed.shape[1])
            to_head = torch.linalg.solve(gram, embed.T @ head)
            model.net.model.embed_tokens.weight[len(old):] = new_embed
            model.net.lm_head.weight[len(old):] = new_embed @ to_head
        for name, t in tensors.items():
            model.net.get_parameter(name).copy_(t.float())
    return model
