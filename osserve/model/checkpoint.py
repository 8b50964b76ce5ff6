"""Writing random-weight gpt-oss checkpoints in exactly the Hugging Face layout.

`osserve checkpoint --preset tiny|20b|120b --out DIR --seed N` writes config.json, sharded
`model-0000X-of-0000N.safetensors` and `model.safetensors.index.json`. Weights are deterministic
from the seed and scaled so activations look like a trained model's: unit-scale hidden states
after each norm, attention scores with a spread, a router that picks varied experts, and
expert gate values that sometimes pass the SwiGLU clamp (so the clamp matters in tests).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from rich.progress import Progress
from safetensors.torch import save_file

from osserve.config import ModelConfig
from osserve.model.gpt_oss import GptOssForCausalLM
from osserve.model.weights import INDEX_FILE, checkpoint_layout

# E2M1 codes drawn uniformly have an RMS of sqrt(mean(v^2)) over the 8 magnitudes.
E2M1_RMS = math.sqrt(sum(v * v for v in (0, 0.5, 1, 1.5, 2, 3, 4, 6)) / 8)
# Gate/up projections run "hot": this factor makes |gate| > swiglu_limit for a few % of values.
GATE_UP_GAIN = 2.0
DEFAULT_SHARD_BYTES = 4 * 2**30

Init = Callable[[tuple[int, ...], torch.Generator], torch.Tensor]


def _normal(std: float, mean: float = 0.0) -> Init:
    def init(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
        return (torch.randn(shape, generator=g, device=g.device) * std + mean).to(torch.bfloat16)

    return init


def _mxfp4_blocks(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 256, shape, generator=g, device=g.device, dtype=torch.uint8)


def _mxfp4_scales(fan_in: int, gain: float) -> Init:
    """Scale exponents giving the dequantised weights a std of about gain/sqrt(fan_in)."""
    center = round(math.log2(gain / (math.sqrt(fan_in) * E2M1_RMS))) + 127

    def init(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
        jitter = torch.randint(-1, 2, shape, generator=g, device=g.device, dtype=torch.int32)
        return (center + jitter).clamp(0, 254).to(torch.uint8)

    return init


def _initializer(name: str, cfg: ModelConfig) -> Init:
    h, i = cfg.hidden_size, cfg.intermediate_size
    if name.endswith("layernorm.weight") or name == "model.norm.weight":
        return _normal(0.1, mean=1.0)
    if name == "model.embed_tokens.weight":
        return _normal(1.0)
    if name == "lm_head.weight":
        return _normal(2.0 / math.sqrt(h))  # logits with a spread of a few nats
    if name.endswith("sinks"):
        return _normal(1.0)
    if name.endswith("gate_up_proj_blocks") or name.endswith("down_proj_blocks"):
        return _mxfp4_blocks
    if name.endswith("gate_up_proj_scales"):
        return _mxfp4_scales(h, GATE_UP_GAIN)
    if name.endswith("down_proj_scales"):
        return _mxfp4_scales(i, 1.0)
    if name.endswith("bias"):
        return _normal(0.02)
    if name.endswith("o_proj.weight"):
        return _normal(1.0 / math.sqrt(cfg.q_size))
    if name.endswith("weight"):  # q/k/v projections and the router
        return _normal(1.0 / math.sqrt(h))
    raise ValueError(f"no initializer for {name}")


def random_tensors(
    cfg: ModelConfig, seed: int, device: str | torch.device = "cpu"
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every checkpoint tensor, in layout order, each from its own seeded generator.

    One generator per tensor (seed mixed with the tensor's index) keeps any tensor reproducible
    without generating the ones before it.
    """
    for idx, (name, (shape, dtype)) in enumerate(checkpoint_layout(cfg).items()):
        g = torch.Generator(device=device).manual_seed(seed * 100_003 + idx)
        t = _initializer(name, cfg)(shape, g)
        assert t.dtype == dtype, (name, t.dtype, dtype)
        yield name, t


def write_checkpoint(
    cfg: ModelConfig,
    out_dir: str | Path,
    seed: int = 0,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    show_progress: bool = True,
) -> Path:
    """Write a random-weight checkpoint; returns the folder."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    layout = checkpoint_layout(cfg)
    total_bytes = sum(math.prod(s) * d.itemsize for s, d in layout.values())
    shards: list[dict[str, torch.Tensor]] = [{}]
    shard_bytes = 0
    tmp_names: list[Path] = []
    weight_map: dict[str, int] = {}

    def flush() -> None:
        path = out / f"shard-{len(tmp_names):05d}.tmp"
        save_file(shards[-1], str(path), metadata={"format": "pt"})
        tmp_names.append(path)

    with Progress(disable=not show_progress, transient=True) as progress:
        task = progress.add_task(f"writing {out.name}", total=total_bytes)
        for name, tensor in random_tensors(cfg, seed):
            nbytes = tensor.numel() * tensor.element_size()
            if shards[-1] and shard_bytes + nbytes > max_shard_bytes:
                flush()
                shards.append({})
                shard_bytes = 0
            shards[-1][name] = tensor
            weight_map[name] = len(shards) - 1
            shard_bytes += nbytes
            progress.advance(task, nbytes)
        flush()
    n = len(tmp_names)
    files = [f"model-{k + 1:05d}-of-{n:05d}.safetensors" for k in range(n)]
    for tmp, final in zip(tmp_names, files, strict=True):
        tmp.rename(out / final)
    index = {
        "metadata": {"total_size": total_bytes},
        "weight_map": {name: files[k] for name, k in sorted(weight_map.items())},
    }
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    (out / "config.json").write_text(json.dumps(cfg.to_hf_dict(), indent=2) + "\n")
    return out


def checkpoint_size_bytes(cfg: ModelConfig) -> int:
    return sum(math.prod(s) * d.itemsize for s, d in checkpoint_layout(cfg).values())


def fill_random_weights(model: GptOssForCausalLM, cfg: ModelConfig, seed: int = 0) -> None:
    """`--load-format dummy`: random weights of the real shapes generated straight on the model's
    device, one tensor at a time, so a 120b needs no disk and no host copy. A model built with a
    ShardLayout takes its rank's share of each: the same weights as the one-GPU model's."""
    targets = dict(model.named_parameters()) | dict(model.named_buffers())
    device = next(model.parameters()).device
    layout = model.layout
    if layout is not None:
        from osserve.distributed.sharding import cut_tensor, rule_for
    with torch.no_grad():
        for name, tensor in random_tensors(cfg, seed, device):
            targets[name].copy_(tensor if layout is None else cut_tensor(tensor, rule_for(name, cfg, layout)))
            del tensor
