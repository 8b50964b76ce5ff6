"""Loading a Hugging Face gpt-oss checkpoint (config.json + sharded safetensors) into the model.

The checkpoint layout (names, shapes, dtypes) is stated once, in `checkpoint_layout`; the writer
(model/checkpoint.py) and the loader both follow it. Experts stay MXFP4: dequantising is the
op's job, not the loader's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from rich.progress import Progress
from safetensors import safe_open

from osserve.config import ModelConfig
from osserve.errors import CheckpointError
from osserve.model.gpt_oss import GptOssForCausalLM

if TYPE_CHECKING:
    from osserve.distributed.layout import ShardLayout
    from osserve.distributed.sharding import Rule

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"

TensorSpec = tuple[tuple[int, ...], torch.dtype]


def checkpoint_layout(cfg: ModelConfig) -> dict[str, TensorSpec]:
    """Every tensor of a gpt-oss checkpoint in the layout of openai/gpt-oss-20b."""
    bf16, u8 = torch.bfloat16, torch.uint8
    h, i, e = cfg.hidden_size, cfg.intermediate_size, cfg.num_local_experts
    out: dict[str, TensorSpec] = {"model.embed_tokens.weight": ((cfg.vocab_size, h), bf16)}
    for n in range(cfg.num_hidden_layers):
        p = f"model.layers.{n}."
        out[p + "input_layernorm.weight"] = ((h,), bf16)
        out[p + "post_attention_layernorm.weight"] = ((h,), bf16)
        for proj, rows in (("q", cfg.q_size), ("k", cfg.kv_size), ("v", cfg.kv_size)):
            out[p + f"self_attn.{proj}_proj.weight"] = ((rows, h), bf16)
            out[p + f"self_attn.{proj}_proj.bias"] = ((rows,), bf16)
        out[p + "self_attn.o_proj.weight"] = ((h, cfg.q_size), bf16)
        out[p + "self_attn.o_proj.bias"] = ((h,), bf16)
        out[p + "self_attn.sinks"] = ((cfg.num_attention_heads,), bf16)
        out[p + "mlp.router.weight"] = ((e, h), bf16)
        out[p + "mlp.router.bias"] = ((e,), bf16)
        x = p + "mlp.experts."
        if cfg.quant_method == "mxfp4":
            out[x + "gate_up_proj_blocks"] = ((e, 2 * i, h // 32, 16), u8)
            out[x + "gate_up_proj_scales"] = ((e, 2 * i, h // 32), u8)
            out[x + "down_proj_blocks"] = ((e, h, i // 32, 16), u8)
            out[x + "down_proj_scales"] = ((e, h, i // 32), u8)
        else:
            raise CheckpointError("only MXFP4 expert checkpoints are supported")
        out[x + "gate_up_proj_bias"] = ((e, 2 * i), bf16)
        out[x + "down_proj_bias"] = ((e, h), bf16)
    out["model.norm.weight"] = ((h,), bf16)
    out["lm_head.weight"] = ((cfg.vocab_size, h), bf16)
    return out


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The shard files, from the index when there is one."""
    index = model_dir / INDEX_FILE
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not (model_dir / f).is_file()]
        if missing:
            raise CheckpointError(f"{model_dir}: shard(s) named in {INDEX_FILE} are missing: {missing}")
        return [model_dir / f for f in files]
    if (model_dir / SINGLE_FILE).is_file():
        return [model_dir / SINGLE_FILE]
    raise CheckpointError(f"{model_dir}: no {INDEX_FILE} or {SINGLE_FILE}")


def iter_checkpoint(model_dir: Path, device: torch.device, rule: Callable[[str], Rule] | None = None,
                    ) -> Iterator[tuple[str, tuple[int, ...], torch.Tensor]]:
    """(name, its shape in the file, tensor) for every tensor, shard by shard, loaded straight onto
    `device`: the whole tensor, or where `rule` gives each name's sharding rule, this rank's share
    of it (distributed/sharding.py), of which only the rank's rows are read."""
    for path in checkpoint_files(model_dir):
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            for name in f.keys():
                if rule is None:
                    tensor = f.get_tensor(name)
                    yield name, tuple(tensor.shape), tensor
                    continue
                from osserve.distributed.sharding import read_cut

                yield name, tuple(f.get_slice(name).get_shape()), read_cut(f, name, device, rule(name))


def load_weights(
    model: GptOssForCausalLM, model_dir: str | Path, show_progress: bool = True
) -> None:
    """Copy every checkpoint tensor into `model`, checking names, shapes and dtypes (a model built
    with a ShardLayout takes its rank's share of each)."""
    model_dir = Path(model_dir)
    layout = checkpoint_layout(model.config)
    targets = dict(model.named_parameters()) | dict(model.named_buffers())
    device = next(model.parameters()).device
    seen: set[str] = set()
    with Progress(disable=not show_progress, transient=True) as progress:
        task = progress.add_task(f"loading {model_dir.name}", total=len(layout))
        for name, file_shape, tensor in iter_checkpoint(model_dir, device, _sharding_rule(model)):
            if name not in layout:
                raise CheckpointError(f"unexpected tensor '{name}' in {model_dir}")
            shape, dtype = layout[name]
            if file_shape != shape:
                raise CheckpointError(
                    f"tensor '{name}' has shape {file_shape}, expected {shape}"
                )
            if tensor.dtype != dtype:
                raise CheckpointError(f"tensor '{name}' has dtype {tensor.dtype}, expected {dtype}")
            with torch.no_grad():
                targets[name].copy_(tensor)
            seen.add(name)
            progress.advance(task)
    missing = sorted(set(layout) - seen)
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise CheckpointError(f"{model_dir}: missing tensor(s) {missing[:5]}{more}")


def _sharding_rule(model: GptOssForCausalLM) -> Callable[[str], Rule] | None:
    """Each checkpoint name's rule for a model built with a ShardLayout; None for a whole model."""
    layout = model.layout
    if layout is None:
        return None
    from osserve.distributed.sharding import rule_for

    known = checkpoint_layout(model.config)  # an unknown name is load_weights' error to report
    return lambda name: rule_for(name, model.config, layout) if name in known else None


def build_model(
    cfg: ModelConfig, device: str | torch.device, dtype: torch.dtype, layout: ShardLayout | None = None,
) -> GptOssForCausalLM:
    """An uninitialised model on `device` (parameters in `dtype`, MXFP4 buffers uint8); with
    `layout`, the part of it one rank holds."""
    with torch.device("meta"):
        model = GptOssForCausalLM(cfg, layout)
    model = model.to_empty(device=device)
    for p in model.parameters():
        p.data = p.data.to(dtype)
    # Non-persistent buffers are not in the checkpoint: compute them again on the device.
    model.build_buffers(device)
    return model.eval().requires_grad_(False)


def load_model(
    model_dir: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
    show_progress: bool = True,
) -> GptOssForCausalLM:
    cfg = ModelConfig.from_pretrained(model_dir)
    model = build_model(cfg, device, dtype)
    load_weights(model, model_dir, show_progress)
    return model
