"""Routing -> expert-sorted, BLOCK_M-padded row order for the grouped MoE GEMMs.

Each (token, slot) pair of `topk_ids [T, k]` is a "slot" s = t*k + j. The plan lists the slots
grouped by expert, each expert's segment padded up to a multiple of BLOCK_M with the sentinel
value T*k, so that every BLOCK_M-row tile of the GEMMs belongs to exactly one expert.

Both ways of building it run on the device: a histogram over experts, an exclusive cumsum of the
padded counts, then a stable scatter. No host sync and buffer sizes depend only on (T, k, E,
BLOCK_M), so the decode path is CUDA-graph capturable. At batches of one router token block the
fused router's last program builds it (`build_plan`, router/fused_triton.py), which saves a launch;
above, its own launch does (`align_tokens`), one program per expert. One token's plan
(`plan_one_token`) keeps its tiles in slot order rather than expert order: the MoE kernels read
each tile's expert on its own and never rely on the order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

_empty = torch.empty  # one seam for tests to poison fresh buffers


@dataclass
class RoutingPlan:
    sorted_slots: torch.Tensor  # [max_padded] int32: slot ids grouped by expert; T*k marks padding
    block_expert: torch.Tensor  # [max_blocks] int32: the expert of each BLOCK_M tile; -1 past the end
    num_padded: torch.Tensor  # [1] int32: rows in use (sum of padded segments), read on device
    max_blocks: int  # upper bound on the tiles in use: the GEMM grid's M extent
    block_m: int


def max_padded_rows(num_slots: int, num_experts: int, block_m: int) -> int:
    """Upper bound on the padded rows: at most min(slots, E) experts are hit, each wasting < BLOCK_M."""
    return num_slots + min(num_slots, num_experts) * (block_m - 1)


@triton.jit
def build_plan(
    ids_ptr,  # [M] expert id of each slot (int32 or int64: read as given, no conversion launch)
    sorted_ptr,  # [max_padded] int32 out
    block_expert_ptr,  # [max_blocks] int32 out
    num_padded_ptr,  # [1] int32 out
    M,
    max_padded,
    max_blocks,
    BLOCK_M: tl.constexpr,
    E_P2: tl.constexpr,  # num_experts rounded up to a power of two
    CHUNK: tl.constexpr,
):
    """The whole plan, by one program (this file's kernel, or the fused router's last program)."""
    experts = tl.arange(0, E_P2)
    # Pass 1: histogram over experts, CHUNK slots at a time (one-hot [CHUNK, E_P2] summed).
    counts = tl.zeros([E_P2], dtype=tl.int32)
    for start in range(0, M, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        ids = tl.load(ids_ptr + offs, mask=offs < M, other=-1)
        counts += tl.sum((ids[:, None] == experts[None, :]).to(tl.int32), axis=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)  # [E_P2] inclusive
    starts = ends - padded
    total = tl.sum(padded, axis=0)
    tl.store(num_padded_ptr, total)

    # The expert of each tile: the number of segments that end at or before its first row.
    for start in range(0, max_blocks, CHUNK):
        blocks = start + tl.arange(0, CHUNK)
        row = blocks * BLOCK_M
        e = tl.sum((ends[None, :] <= row[:, None]).to(tl.int32), axis=1)
        e = tl.where(row < total, e, -1)
        tl.store(block_expert_ptr + blocks, e, mask=blocks < max_blocks)

    # Padding rows point at the sentinel M; real slots overwrite theirs below.
    for start in range(0, max_padded, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        tl.store(sorted_ptr + offs, tl.zeros([CHUNK], dtype=tl.int32) + M, mask=offs < max_padded)
    tl.debug_barrier()  # the sentinel stores must land before the scatter (same program, other threads)

    # Pass 2: stable scatter. A slot's row = its expert's start + earlier slots of that expert.
    running = starts
    for start in range(0, M, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        ids = tl.load(ids_ptr + offs, mask=offs < M, other=-1)
        onehot = (ids[:, None] == experts[None, :]).to(tl.int32)  # [CHUNK, E_P2]
        before = tl.cumsum(onehot, axis=0) - onehot + running[None, :]
        dest = tl.sum(onehot * before, axis=1)
        tl.store(sorted_ptr + dest, offs, mask=offs < M)
        running += tl.sum(onehot, axis=0)


@triton.jit
def plan_one_token(
    ids,  # [1, K] the token's expert ids, in registers: distinct (a top-k)
    sorted_ptr,  # [K * BLOCK_M] int32 out
    block_expert_ptr,  # [K] int32 out
    num_padded_ptr,  # [1] int32 out
    K: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """The plan for one token (M = K slots; max_padded K * BLOCK_M, max_blocks K), from its ids as
    the top-k left them in registers. Its experts are distinct, so each slot is alone in a tile:
    tile j holds slot j and is expert ids[j]'s. The tiles are in slot order, not expert order as
    build_plan's (the MoE kernels read each tile's expert on its own), so the rows are the same
    for every token and nothing is read back: in the fused router's last program that saves a CTA
    barrier and a round trip through L2 for the ids it has just stored."""
    tl.store(block_expert_ptr + tl.arange(0, K)[None, :], ids.to(tl.int32))
    rows = tl.arange(0, K * BLOCK_M)
    tl.store(sorted_ptr + rows, tl.where(rows % BLOCK_M == 0, rows // BLOCK_M, K))
    tl.store(num_padded_ptr, K * BLOCK_M)


@triton.jit(do_not_specialize=["M", "max_padded", "max_blocks"])  # per-step sizes: no recompiles
def _align_kernel(
    ids_ptr, sorted_ptr, block_expert_ptr, num_padded_ptr, M, max_padded, max_blocks,  # noqa: ANN001
    BLOCK_M: tl.constexpr, E_P2: tl.constexpr, CHUNK: tl.constexpr,
):
    """build_plan's plan, by one program per expert plus one for what lies past the last segment.
    Every program counts all the slots' experts (the segments before its own fix where that one
    starts), then the expert's program places its own slots in slot order: one pass each instead
    of one program's serial passes over every expert (at 120b, 1024 slots and 128 experts, that
    program took ~44 us a layer)."""
    program = tl.program_id(0)
    counts = tl.zeros([E_P2], dtype=tl.int32)
    for start in range(0, M, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        ids = tl.load(ids_ptr + offs, mask=offs < M, other=0).to(tl.int32)
        counts += tl.histogram(ids, E_P2, mask=offs < M)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    starts = tl.cumsum(padded, axis=0) - padded
    total = tl.sum(padded, axis=0)
    if program == tl.num_programs(0) - 1:  # past the last segment: sentinel rows, tiles of no expert
        tl.store(num_padded_ptr, total)
        for start in range(total, max_padded, CHUNK):
            rows = start + tl.arange(0, CHUNK)
            tl.store(sorted_ptr + rows, tl.zeros([CHUNK], dtype=tl.int32) + M, mask=rows < max_padded)
        for start in range(total // BLOCK_M, max_blocks, CHUNK):
            tiles = start + tl.arange(0, CHUNK)
            tl.store(block_expert_ptr + tiles, tl.full([CHUNK], -1, tl.int32), mask=tiles < max_blocks)
    else:
        mine = tl.arange(0, E_P2) == program
        begin = tl.sum(tl.where(mine, starts, 0), axis=0)
        count = tl.sum(tl.where(mine, counts, 0), axis=0)
        size = tl.sum(tl.where(mine, padded, 0), axis=0)
        for start in range(0, size // BLOCK_M, CHUNK):
            tiles = start + tl.arange(0, CHUNK)
            tl.store(block_expert_ptr + begin // BLOCK_M + tiles, tl.zeros([CHUNK], dtype=tl.int32) + program,
                     mask=tiles < size // BLOCK_M)
        pad = begin + count + tl.arange(0, BLOCK_M)  # the segment's padding rows
        tl.store(sorted_ptr + pad, tl.zeros([BLOCK_M], dtype=tl.int32) + M, mask=pad < begin + size)
        row = begin  # the next free row of the segment
        for start in range(0, M, CHUNK):
            offs = start + tl.arange(0, CHUNK)
            ids = tl.load(ids_ptr + offs, mask=offs < M, other=-1).to(tl.int32)
            hit = (ids == program).to(tl.int32)
            tl.store(sorted_ptr + row + tl.cumsum(hit, axis=0) - hit, offs, mask=hit != 0)
            row += tl.sum(hit, axis=0)


@dataclass(frozen=True)
class PlanShape:
    """A plan's buffer sizes, which depend only on (slots, E, BLOCK_M): fixed per batch size."""

    num_slots: int
    max_padded: int
    max_blocks: int
    e_p2: int
    chunk: int

    @classmethod
    def of(cls, num_slots: int, num_experts: int, block_m: int) -> PlanShape:
        max_padded = max_padded_rows(num_slots, num_experts, block_m)
        e_p2 = triton.next_power_of_2(num_experts)
        chunk = max(16, min(triton.next_power_of_2(num_slots), 8192 // e_p2))  # one-hot tile <= 8K ints
        return cls(num_slots, max_padded, triton.cdiv(max_padded, block_m), e_p2, chunk)


def empty_plan(shape: PlanShape, block_m: int, device: torch.device) -> RoutingPlan:
    """Unwritten plan buffers, for a kernel that builds the plan (build_plan) to fill."""
    return RoutingPlan(_empty(shape.max_padded, dtype=torch.int32, device=device),
                       _empty(shape.max_blocks, dtype=torch.int32, device=device),
                       _empty(1, dtype=torch.int32, device=device), shape.max_blocks, block_m)


def align_tokens(topk_ids: torch.Tensor, num_experts: int, block_m: int, chunk: int = 1024) -> RoutingPlan:
    """topk_ids [T, k] -> RoutingPlan (one kernel launch, no host sync). chunk: slots a program
    reads at a time, one value for every batch size, so that no batch size compiles a kernel of its
    own in the middle of serving (tests make it small to cover the loops)."""
    shape = PlanShape.of(topk_ids.numel(), num_experts, block_m)
    plan = empty_plan(shape, block_m, topk_ids.device)
    _align_kernel[(num_experts + 1,)](
        topk_ids.reshape(-1), plan.sorted_slots, plan.block_expert, plan.num_padded, shape.num_slots,
        shape.max_padded, shape.max_blocks, BLOCK_M=block_m, E_P2=shape.e_p2, CHUNK=chunk, num_warps=4,
    )
    return plan
