"""EAGLE3 draft checkpoints: the tensor layout, the loader, and random drafts.

`load_draft(DIR, target)` reads any of the three published layouts (model/eagle3.py says which):
names are mapped to SpecForge's (`layers.0.` -> `midlayer.`, a leading `model.` dropped), then every
tensor must be one the config calls for, with its shape. A name that fits nothing, a shape that
does not match the target, a missing tensor or a d2t map that points outside the vocabulary stops
the load with a CheckpointError naming it: nothing is skipped (a loader that dropped unknown names
once served an empty layer). `osserve checkpoint --preset eagle3 --target DIR --out DIR2` writes a
random draft sized for the target in SpecForge's layout; `random_draft` makes the same on the
device for `--load-format dummy`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from osserve.config import ModelConfig
from osserve.errors import CheckpointError, ConfigError
from osserve.model.eagle3 import Eagle3Config, Eagle3Draft
from osserve.model.weights import INDEX_FILE

DRAFT_VOCAB = 32000  # the published gpt-oss drafts' draft_vocab_size

TensorSpec = tuple[tuple[int, ...], torch.dtype]


def draft_layout(cfg: Eagle3Config, fc_bias: bool, own_embedding: bool, own_head: bool,
                 has_t2d: bool) -> dict[str, TensorSpec]:
    """Every tensor of a draft checkpoint, by SpecForge's name. Float tensors are listed bf16 (any
    float dtype loads); d2t is int64 and t2d bool."""
    bf16, h, i = torch.bfloat16, cfg.hidden_size, cfg.intermediate_size
    out: dict[str, TensorSpec] = {}
    if cfg.aux_layer_ids:
        out["fc.weight"] = ((h, 3 * h), bf16)
        if fc_bias:
            out["fc.bias"] = ((h,), bf16)
    if cfg.norm_before_fc:
        out["input_norm.weight"] = ((3 * h,), bf16)
    m = "midlayer."
    for norm in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        out[m + norm + ".weight"] = ((h,), bf16)
    for proj, rows, cols in (("q", cfg.q_size, 2 * h), ("k", cfg.kv_size, 2 * h), ("v", cfg.kv_size, 2 * h),
                             ("o", h, cfg.q_size)):
        out[m + f"self_attn.{proj}_proj.weight"] = ((rows, cols), bf16)
        if cfg.attention_bias:
            out[m + f"self_attn.{proj}_proj.bias"] = ((rows,), bf16)
    out[m + "mlp.gate_proj.weight"] = ((i, h), bf16)
    out[m + "mlp.up_proj.weight"] = ((i, h), bf16)
    out[m + "mlp.down_proj.weight"] = ((h, i), bf16)
    out["norm.weight"] = ((h,), bf16)
    if own_head:
        out["lm_head.weight"] = ((cfg.draft_vocab_size or cfg.vocab_size, h), bf16)
    if own_embedding:
        out["embed_tokens.weight"] = ((cfg.vocab_size, h), bf16)
    if cfg.draft_vocab_size is not None:
        out["d2t"] = ((cfg.draft_vocab_size,), torch.int64)
        if has_t2d:
            out["t2d"] = ((cfg.vocab_size,), torch.bool)
    return out


def canonical_name(name: str) -> str:
    if name.startswith("model."):
        name = name[len("model."):]
    if name.startswith("layers.0."):
        name = "midlayer." + name[len("layers.0."):]
    return name


def _files(folder: Path) -> list[Path]:
    index = folder / INDEX_FILE
    if index.is_file():
        return [folder / f for f in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder}: no safetensors files in the draft folder (osserve reads safetensors only)")
    return files


def _tensors(folder: Path, device: str) -> Iterator[tuple[str, str, torch.Tensor]]:
    """(name as stored, canonical name, tensor) for every tensor of the draft."""
    for path in _files(folder):
        with safe_open(str(path), framework="pt", device=device) as f:
            for name in f.keys():
                yield name, canonical_name(name), f.get_tensor(name)


def load_draft(folder: str | Path, target: ModelConfig, device: torch.device, dtype: torch.dtype) -> Eagle3Draft:
    folder = Path(folder)
    path = folder / "config.json"
    if not path.is_file():
        raise ConfigError(f"{folder}: no config.json: is this an EAGLE3 draft folder?", "speculative_config.model")
    cfg = Eagle3Config.from_dict(json.loads(path.read_text()), target)
    names: dict[str, str] = {}
    for f in _files(folder):
        with safe_open(str(f), framework="pt") as handle:
            for name in handle.keys():
                key = canonical_name(name)
                if key in names:
                    raise CheckpointError(f"{folder}: tensor '{name}' appears twice (as '{names[key]}')")
                names[key] = name
    if cfg.draft_vocab_size is not None and "lm_head.weight" not in names:
        raise CheckpointError(f"{folder}: config.json has draft_vocab_size {cfg.draft_vocab_size} but the checkpoint "
                              "has no lm_head.weight")
    layout = draft_layout(cfg, "fc.bias" in names, "embed_tokens.weight" in names, "lm_head.weight" in names,
                          "t2d" in names)
    unknown = sorted(names[n] for n in names if n not in layout)
    if unknown:
        raise CheckpointError(f"{folder}: tensor(s) {unknown[:8]} fit no part of an EAGLE3 draft of this config")
    missing = sorted(set(layout) - set(names))
    if missing:
        raise CheckpointError(f"{folder}: missing tensor(s) {missing[:8]}")
    draft = build_draft(cfg, "fc.bias" in names, "embed_tokens.weight" in names, "lm_head.weight" in names,
                        device, dtype)
    targets = dict(draft.named_parameters()) | dict(draft.named_buffers())
    t2d = None
    for stored, name, tensor in _tensors(folder, str(device)):
        shape, kind = layout[name]
        if tuple(tensor.shape) != shape:
            raise CheckpointError(f"{folder}: tensor '{stored}' has shape {tuple(tensor.shape)}, expected {shape} "
                                  f"for this target (hidden {target.hidden_size}, vocabulary {target.vocab_size})")
        if name == "t2d":
            t2d = tensor.bool()
            continue
        if kind.is_floating_point != tensor.dtype.is_floating_point:
            raise CheckpointError(f"{folder}: tensor '{stored}' has dtype {tensor.dtype}, expected {kind}")
        with torch.no_grad():
            targets[name].copy_(tensor)
    check_vocab_map(draft, t2d, folder)
    return draft


def check_vocab_map(draft: Eagle3Draft, t2d: torch.Tensor | None, where: object) -> None:
    """d2t sends draft ids to distinct target ids inside the vocabulary, and agrees with t2d."""
    if draft.d2t is None:
        return
    ids = torch.arange(draft.d2t.shape[0], device=draft.d2t.device) + draft.d2t
    vocab = draft.config.vocab_size
    if bool((ids < 0).any()) or bool((ids >= vocab).any()) or ids.unique().numel() != ids.numel():
        raise CheckpointError(f"{where}: d2t maps draft ids outside the vocabulary [0, {vocab}) or two onto one")
    if t2d is not None and (int(t2d.sum()) != ids.numel() or not bool(t2d[ids].all())):
        raise CheckpointError(f"{where}: t2d does not mark exactly the target ids d2t maps to")


def build_draft(cfg: Eagle3Config, fc_bias: bool, own_embedding: bool, own_head: bool, device: torch.device,
                dtype: torch.dtype) -> Eagle3Draft:
    """An uninitialised draft on the device (float parameters in dtype)."""
    with torch.device("meta"):
        draft = Eagle3Draft(cfg, fc_bias=fc_bias, own_embedding=own_embedding, own_head=own_head)
    draft = draft.to_empty(device=device)
    for p in draft.parameters():
        p.data = p.data.to(dtype)
    return draft.eval().requires_grad_(False)


# ---------------------------------------------------------------------- random drafts
def draft_config_for(target: ModelConfig, draft_vocab_size: int | None = DRAFT_VOCAB) -> Eagle3Config:
    """A draft of the published gpt-oss shape for `target`: its attention shape, a 6x FFN (17280 at
    hidden 2880), 32000 draft tokens, and the published layer choice [1, L/2 - 1, L - 3]."""
    n = target.num_hidden_layers
    return Eagle3Config(
        hidden_size=target.hidden_size, intermediate_size=6 * target.hidden_size,
        num_attention_heads=target.num_attention_heads, num_key_value_heads=target.num_key_value_heads,
        head_dim=target.head_dim, vocab_size=target.vocab_size,
        draft_vocab_size=None if draft_vocab_size is None else min(draft_vocab_size, target.vocab_size),
        aux_layer_ids=(min(1, n - 1), max(0, n // 2 - 1), max(0, n - 3)), rms_norm_eps=target.rms_norm_eps,
    )


def random_draft_tensors(cfg: Eagle3Config, seed: int, device: str | torch.device = "cpu",
                         ) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a random draft (no embedding: it shares the target's), each from its own
    generator. The draft vocabulary is a random sorted subset of the target's."""
    layout = draft_layout(cfg, False, False, True, cfg.draft_vocab_size is not None)
    h = cfg.hidden_size
    for idx, (name, (shape, dtype)) in enumerate(layout.items()):
        g = torch.Generator(device=device).manual_seed(seed * 100_003 + idx)
        if name == "d2t":
            ids = torch.randperm(cfg.vocab_size, generator=g, device=device)[: shape[0]].sort().values
            yield name, ids - torch.arange(shape[0], device=device)
            continue
        if name == "t2d":
            continue  # written with d2t below
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=g, device=device)
        elif name == "lm_head.weight":
            t = torch.randn(shape, generator=g, device=device) * (2.0 / math.sqrt(h))
        else:
            t = torch.randn(shape, generator=g, device=device) / math.sqrt(shape[-1])
        yield name, t.to(dtype)


def random_draft(target: ModelConfig, seed: int, device: torch.device, dtype: torch.dtype,
                 cfg: Eagle3Config | None = None) -> Eagle3Draft:
    """`--load-format dummy`: a random draft for `target`, generated on the device."""
    cfg = cfg or draft_config_for(target)
    draft = build_draft(cfg, False, False, True, device, dtype)
    targets = dict(draft.named_parameters()) | dict(draft.named_buffers())
    with torch.no_grad():
        for name, tensor in random_draft_tensors(cfg, seed, device):
            targets[name].copy_(tensor)
    return draft


def write_random_draft(target: ModelConfig, out_dir: str | Path, seed: int = 0,
                       cfg: Eagle3Config | None = None) -> Path:
    """`osserve checkpoint --preset eagle3`: config.json and model.safetensors in SpecForge's layout."""
    cfg = cfg or draft_config_for(target)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = dict(random_draft_tensors(cfg, seed))
    if "d2t" in tensors:
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        t2d[torch.arange(tensors["d2t"].shape[0]) + tensors["d2t"]] = True
        tensors["t2d"] = t2d
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
    return out
