"""Random paged-attention inputs shared by the CPU (interpreter) and GPU tests and the benchmark."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Case:
    q: torch.Tensor  # [T, H, D]
    k_cache: torch.Tensor  # [num_blocks, block_size, kv_heads, D]
    v_cache: torch.Tensor
    sinks: torch.Tensor  # [H]
    query_start_loc: list[int]
    seq_lens: list[int]
    block_tables: torch.Tensor  # [B, max_blocks] int32
    scale: float
    window: int | None

    def device_meta(self) -> tuple[torch.Tensor, torch.Tensor]:
        dev = self.q.device
        return (torch.tensor(self.query_start_loc, dtype=torch.int32, device=dev),
                torch.tensor(self.seq_lens, dtype=torch.int32, device=dev))


def make_case(
    seqs: list[tuple[int, int]],  # (seq_len, query_len) per sequence
    num_heads: int, kv_heads: int, head_dim: int, block_size: int, window: int | None,
    dtype: torch.dtype = torch.float32, device: str = "cpu", outside: str = "hole", seed: int = 0,
) -> Case:
    """Blocks are handed out in a random order (non-contiguous tables). Blocks wholly before the
    first key any query of the step can see (window layers) become -1 (outside="hole") or point at
    a block full of NaN (outside="poison"): a kernel that loads them fails the comparison."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-s // block_size) for s, _ in seqs]
    num_blocks = sum(blocks_per_seq) + 2
    perm = torch.randperm(num_blocks - 1, generator=gen) + 1  # block 0: the NaN block
    max_blocks = max(blocks_per_seq) + 1
    tables = torch.full((len(seqs), max_blocks), -1, dtype=torch.int32)
    used = 0
    for b, ((seq_len, q_len), n) in enumerate(zip(seqs, blocks_per_seq, strict=True)):
        tables[b, :n] = perm[used:used + n].to(torch.int32)
        used += n
        if window is not None:
            first_k = max(0, seq_len - q_len - window + 1)
            dead = first_k // block_size  # blocks [0, dead) hold only positions < first_k
            tables[b, :dead] = -1 if outside == "hole" else 0
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen)
    v_cache = torch.randn(shape, generator=gen)
    k_cache[0] = float("nan")
    v_cache[0] = float("nan")
    total = sum(q for _, q in seqs)
    q = torch.randn(total, num_heads, head_dim, generator=gen)
    sinks = torch.randn(num_heads, generator=gen) * 2
    qsl = [0]
    for _, q_len in seqs:
        qsl.append(qsl[-1] + q_len)
    return Case(
        q.to(dtype).to(device), k_cache.to(dtype).to(device), v_cache.to(dtype).to(device),
        sinks.to(device), qsl, [s for s, _ in seqs], tables.to(device), head_dim ** -0.5, window,
    )


def prompt_range(seqs: list[tuple[int, int]]) -> tuple[int, int]:
    """A mixed batch's (context, query) list -> the split AttentionMetadata.prompt_range gives it."""
    from osserve.ops.attention.metadata import AttentionMetadata

    meta = AttentionMetadata(torch.zeros(1), torch.zeros(1), [q for _, q in seqs], [s for s, _ in seqs], {})
    assert meta.prompt_range is not None
    return meta.prompt_range


def reference(case: Case) -> torch.Tensor:
    """The spec on float32 copies."""
    from osserve.ops.attention.reference import paged_attention_reference

    return paged_attention_reference(
        case.q.float(), case.k_cache.float(), case.v_cache.float(), case.sinks.float(),
        case.query_start_loc, case.seq_lens, case.block_tables, case.scale, case.window,
    )


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


def quantised(case: Case):  # type: ignore[no-untyped-def]
    """The case's cache as an FP8 one (ops/attention/kv_format.py), on the case's device; its NaN
    block stays NaN, so a kernel that reads it fails."""
    from osserve.ops.attention.kv_format import KVCache, quantize_reference

    (kq, ks), (vq, vs) = quantize_reference(case.k_cache.float()), quantize_reference(case.v_cache.float())
    return KVCache(kq, vq, ks, vs)


def fp8_reference(case: Case, cache, tree: object = None) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """The spec over the FP8 cache `cache` (float32 queries and sinks; tree: a TreeMask or None)."""
    from osserve.ops.attention.reference import paged_attention_reference

    return paged_attention_reference(
        case.q.float(), cache.k, cache.v, case.sinks.float(), case.query_start_loc, case.seq_lens,
        case.block_tables, case.scale, case.window, tree,  # type: ignore[arg-type]
        k_scales=cache.k_scales, v_scales=cache.v_scales)


def run_fp8(case: Case, cache, is_decode: bool, **kw: object) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """The Triton kernel over the FP8 cache (kw: num_splits, tree, ...); every output row written."""
    from osserve.ops.attention.paged_triton import paged_attention_triton

    qsl, seq_lens = case.device_meta()
    out = torch.full_like(case.q, float("nan"))
    q_lens = [b - a for a, b in zip(case.query_start_loc, case.query_start_loc[1:], strict=False)]
    paged_attention_triton(case.q, cache.k, cache.v, case.sinks, qsl, seq_lens, case.block_tables, case.scale,
                           case.window, max(q_lens), max(case.seq_lens), is_decode, out=out,
                           k_scales=cache.k_scales, v_scales=cache.v_scales, **kw)  # type: ignore[arg-type]
    assert not out.isnan().any(), "unwritten or NaN rows"
    return out
