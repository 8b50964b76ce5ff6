"""How each checkpoint tensor is cut for one rank (layout.py says what the rank holds).

One rule per name, used by the loader (model/weights.py, which reads only the rank's slice from the
safetensors files) and by `--load-format dummy` (model/checkpoint.py, which cuts the full random
tensor), so a rank's weights are exactly its share of the one-GPU model's.

- a `Cut`: a range of one dimension, zero-padded to the rank's size along it;
- `ZERO`: the bias of a row-parallel layer (o_proj; the experts' down projection when the
  experts are split by columns) on every rank but 0: the all-reduce adds it once;
- None: replicated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from osserve.config import ModelConfig
from osserve.distributed.layout import MXFP4_BLOCK, ShardLayout

ZERO: Literal["zero"] = "zero"
SAFETENSORS_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "U8": torch.uint8}


@dataclass(frozen=True)
class Cut:
    """[start, stop) of dimension `dim`, then zeros up to `size` along it."""

    dim: int
    start: int
    stop: int
    size: int


Rule = Cut | Literal["zero"] | None


def rule_for(name: str, cfg: ModelConfig, layout: ShardLayout) -> Rule:
    """The rule for checkpoint tensor `name` (module docstring)."""
    if not name.startswith("model.layers."):
        return None  # the embedding, the final norm, the lm_head
    part = name.split(".", 3)[3]  # after "model.layers.N."
    hd, q, kv = cfg.head_dim, layout.q_heads, layout.kv_heads
    if part.startswith(("self_attn.q_proj.", "self_attn.k_proj.", "self_attn.v_proj.")):
        heads = q if part.startswith("self_attn.q_proj.") else kv
        return Cut(0, heads.start * hd, heads.stop * hd, len(heads) * hd)
    if part == "self_attn.o_proj.weight":
        return Cut(1, q.start * hd, q.stop * hd, len(q) * hd)
    if part == "self_attn.o_proj.bias":
        return ZERO if layout.rank else None
    if part == "self_attn.sinks":
        return Cut(0, q.start, q.stop, len(q))
    if not part.startswith("mlp.experts."):
        return None  # the norms, the router
    if layout.expert_parallel:
        e = layout.experts
        return Cut(0, e.start, e.stop, len(e))
    cols, width = layout.columns, layout.intermediate
    if part.startswith("mlp.experts.gate_up_proj_"):  # rows 2u (gate) and 2u+1 (up) of column u
        return Cut(1, 2 * cols.start, 2 * cols.stop, 2 * width)
    if part in ("mlp.experts.down_proj_blocks", "mlp.experts.down_proj_scales"):  # in MXFP4 blocks
        return Cut(2, cols.start // MXFP4_BLOCK, cols.stop // MXFP4_BLOCK, width // MXFP4_BLOCK)
    if part == "mlp.experts.down_proj_bias":
        return ZERO if layout.rank else None
    raise ValueError(f"no sharding rule for {name}")


def cut_tensor(tensor: torch.Tensor, rule: Rule) -> torch.Tensor:
    """The rank's share of a full tensor."""
    if rule is None:
        return tensor
    if rule == ZERO:
        return torch.zeros_like(tensor)
    return pad(tensor.narrow(rule.dim, rule.start, rule.stop - rule.start), rule)


def read_cut(file: Any, name: str, device: torch.device, rule: Rule) -> torch.Tensor:
    """The rank's share of tensor `name` of an open safetensors file (safe_open's handle, on
    `device`): only the rank's rows are read (the file's lazy slice)."""
    if rule is None:
        return file.get_tensor(name)  # type: ignore[no-any-return]
    lazy = file.get_slice(name)
    if rule == ZERO:
        return torch.zeros(lazy.get_shape(), dtype=SAFETENSORS_DTYPES[lazy.get_dtype()], device=device)
    index = (slice(None),) * rule.dim + (slice(rule.start, rule.stop),)
    return pad(lazy[index], rule)


def pad(part: torch.Tensor, rule: Cut) -> torch.Tensor:
    """Zeros after `part` along rule.dim, up to rule.size."""
    missing = rule.size - part.shape[rule.dim]
    if not missing:
        return part
    widths = [0, 0] * (part.dim() - 1 - rule.dim) + [0, missing]  # F.pad lists the last dimension first
    return F.pad(part, widths)
