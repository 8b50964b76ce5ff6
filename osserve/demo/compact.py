"""The demo checkpoint's compact form (what git holds) and its expansion into the Hugging Face layout.

The compact file is one safetensors file with every tensor of the HF gpt-oss layout (bf16 weights,
MXFP4 expert blocks and scales) except that `embed_tokens` and `lm_head` keep only the rows of the
tokens the model was trained on, listed in `vocab` (int64). Expanding scatters those rows into
zero matrices of the full vocabulary and writes config.json + model.safetensors, which the normal
loader reads. A few MB instead of the ~200 MB the two full-vocabulary matrices would take.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from osserve.demo.trainable import DemoTrainable
from osserve.model.weights import SINGLE_FILE, checkpoint_layout
from osserve.ops.mxfp4.reference import quantize_mxfp4

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
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / (SINGLE_FILE + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tmp.rename(out / SINGLE_FILE)  # last: a folder with model.safetensors is complete
    return out


def corpus_version(path: str | Path) -> int:
    """The corpus a compact checkpoint was trained on (demo/corpus.py); 1 where it does not say."""
    with safe_open(str(path), framework="pt") as f:
        return int((f.metadata() or {}).get("corpus_version", "1"))
