"""The checkpoint writer's layout, determinism and realism; the loader's error messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from osserve.config import preset
from osserve.errors import CheckpointError
from osserve.model.checkpoint import checkpoint_size_bytes, random_tensors, write_checkpoint
from osserve.model.weights import checkpoint_layout, load_model


def test_tiny_layout_matches_hf_names_shapes_dtypes(tiny_checkpoint: Path) -> None:
    index = json.loads((tiny_checkpoint / "model.safetensors.index.json").read_text())
    layout = checkpoint_layout(preset("tiny"))
    assert set(index["weight_map"]) == set(layout)
    tensors: dict[str, torch.Tensor] = {}
    for f in set(index["weight_map"].values()):
        assert f.startswith("model-0000") and f.endswith(".safetensors")
        tensors |= load_file(tiny_checkpoint / f)
    for name, (shape, dtype) in layout.items():
        assert tuple(tensors[name].shape) == shape and tensors[name].dtype == dtype, name
    assert tensors["model.layers.0.mlp.experts.gate_up_proj_blocks"].dtype == torch.uint8
    assert index["metadata"]["total_size"] == checkpoint_size_bytes(preset("tiny"))


def test_20b_layout_has_the_published_shapes() -> None:
    layout = checkpoint_layout(preset("20b"))
    assert layout["model.layers.23.mlp.experts.gate_up_proj_blocks"][0] == (32, 5760, 90, 16)
    assert layout["model.layers.0.mlp.experts.down_proj_scales"][0] == (32, 2880, 90)
    assert layout["model.layers.0.self_attn.q_proj.weight"][0] == (4096, 2880)
    assert layout["model.layers.0.self_attn.k_proj.weight"][0] == (512, 2880)
    assert layout["model.layers.0.self_attn.sinks"][0] == (64,)
    # 20b: about 13.8 GB on disk, as the published checkpoint.
    assert 12.5e9 < checkpoint_size_bytes(preset("20b")) < 14.5e9


def test_deterministic_from_seed_and_sharded(tmp_path: Path) -> None:
    a = write_checkpoint(preset("tiny"), tmp_path / "a", seed=3, max_shard_bytes=20_000_000,
                         show_progress=False)
    files = sorted(p.name for p in a.glob("*.safetensors"))
    assert len(files) > 2 and files[0] == f"model-00001-of-{len(files):05d}.safetensors"
    first = dict(random_tensors(preset("tiny"), seed=3))
    again = dict(random_tensors(preset("tiny"), seed=3))
    other = dict(random_tensors(preset("tiny"), seed=4))
    name = "model.layers.1.self_attn.q_proj.weight"
    assert torch.equal(first[name], again[name]) and not torch.equal(first[name], other[name])


def test_random_weights_are_realistic(tiny_checkpoint: Path) -> None:
    from tests.model.contiguous import ContiguousCache

    model = load_model(tiny_checkpoint, show_progress=False)
    cache = ContiguousCache(model, 1, 200)
    ids, pos, meta = cache.step([0], [list(range(5000, 5200))])
    picked: list[torch.Tensor] = []
    mlp = model.model.layers[0].mlp
    hook = mlp.register_forward_pre_hook(
        lambda m, args: picked.append(mlp.router(args[0]).topk(4, dim=-1).indices)
    )
    with torch.no_grad():
        logits = model.compute_logits(model(ids, pos, meta, cache.kv))
    hook.remove()
    assert torch.isfinite(logits).all()
    assert 1.0 < logits.std(dim=-1).mean().item() < 10.0  # a spread, not saturated
    assert len(picked[0].unique()) == model.config.num_local_experts  # every expert used
    assert len(set(logits.argmax(-1).tolist())) > 50  # positions disagree on their argmax


def _rewrite(src: Path, dst: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    dst.mkdir()
    for f in src.iterdir():
        if f.suffix == ".safetensors":
            tensors = load_file(f)
            edit(tensors)
            save_file(tensors, dst / f.name)
        else:
            (dst / f.name).write_bytes(f.read_bytes())
    return dst


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.pop("model.layers.1.self_attn.sinks"), "missing tensor.*layers.1.self_attn.sinks"),
        (lambda t: t.__setitem__("model.norm.weight", torch.ones(7, dtype=torch.bfloat16)),
         "model.norm.weight' has shape"),
        (lambda t: t.__setitem__("model.norm.weight", torch.ones(128)), "model.norm.weight' has dtype"),
        (lambda t: t.__setitem__("model.extra", torch.ones(1)), "unexpected tensor 'model.extra'"),
    ],
)
def test_loader_names_the_bad_tensor(tiny_checkpoint: Path, tmp_path: Path, edit, message: str) -> None:  # type: ignore[no-untyped-def]
    bad = _rewrite(tiny_checkpoint, tmp_path / "bad", edit)
    with pytest.raises(CheckpointError, match=message):
        load_model(bad, show_progress=False)
