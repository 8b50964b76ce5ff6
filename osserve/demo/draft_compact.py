"""The built-in model's EAGLE3 draft as shipped: one safetensors file holding the draft's tensors in
SpecForge's layout (model/eagle3_weights.py) with its config.json in the metadata. Expanding writes
the folder the draft loader reads. Its head covers only the tokens the demo corpus uses (d2t maps
them to the full vocabulary) and it shares the target's embedding, so the file is small."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from osserve.demo.compact import write_folder


def save_draft(tensors: dict[str, torch.Tensor], config: dict[str, object], path: str | Path,
               metadata: dict[str, str]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path),
              metadata={"config": json.dumps(config), **metadata})
    return path


def expand_draft(path: str | Path, out_dir: str | Path) -> Path:
    """config.json + model.safetensors in out_dir (the last written last: a folder that has it is whole)."""
    with safe_open(str(path), framework="pt") as f:
        config = json.loads(f.metadata()["config"])
    return write_folder(out_dir, config, load_file(str(path)))
