"""Every Triton kernel of the portable path, compiled for GPUs we cannot run: sm_80 (A100), sm_86 (A10,
RTX 30xx) and sm_89 (L4, RTX 40xx), by Triton's own compiler and the ptxas it ships, on a CPU. Prints
each kernel's registers, spilled bytes and shared memory, and fails where a kernel does not compile
or would not fit the target's shared memory (a block gets 99 KB on sm_86/89, 163 KB on sm_80).

What is compiled is what the portable policy launches: the op launchers (the same functions the
dispatchers call) run at gpt-oss-20b's shapes with the policy of the target entered (ops/policy.py:
stages sized to its shared memory, no PDL, no sm_90 PTX) and CPU tensors, and each kernel launch is
caught before it reaches a driver; its arguments are bound the way Triton's JIT binds them (types,
divisibility by 16, constexprs) and compiled with an explicit GPUTarget. The shapes cover each
config the portable path picks: decode (1, 8, 32 tokens), mixed steps (64-4096 tokens through the
swapped MoE kernel) and prefill (8192-token steps through the token-tiled one).

--control also compiles the Hopper policy's launches for sm_90 (they must compile) and for sm_86,
where the kernels with sm_90 inline PTX must fail: proof that the check catches what it is for.

    PYTHONPATH=$PWD python3 benchmarks/compile_targets.py [--targets sm_80,sm_86,sm_89] [--control] [--json OUT]

Needs no GPU; run it without TRITON_INTERPRET (the interpreter replaces the kernels). Compiles are
cached by Triton (~/.triton/cache, or TRITON_CACHE_DIR).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import JITFunction, create_function_from_signature

from osserve.ops.policy import SHARED_MEMORY_BY_CAPABILITY, KernelPolicy, decide, use_policy

TARGETS = {"sm_80": (8, 0), "sm_86": (8, 6), "sm_89": (8, 9), "sm_90": (9, 0), "sm_100": (10, 0), "sm_120": (12, 0)}
BF16 = torch.bfloat16
H, I, E, K = 2880, 2880, 32, 4  # gpt-oss-20b's hidden, expert FFN, experts, experts per token
HEADS, KV_HEADS, HEAD_DIM, VOCAB = 64, 8, 64, 201088
BLOCK, NUM_BLOCKS = 16, 64  # KV cache blocks (their count is not specialised on)


@dataclass
class Launch:
    scenario: str  # which step of the model, at which batch
    fn: JITFunction
    args: tuple
    kwargs: dict


@dataclass
class Compiled:
    kernel: str
    scenarios: str
    config: str  # the launch's tile constexprs, warps and stages
    target: str
    ok: bool
    registers: int = 0
    spilled: int = 0  # stack and local memory a thread uses (register spills), bytes
    shared: int = 0  # dynamic shared memory a block needs, bytes
    shared_limit: int = 0
    error: str = ""


# ------------------------------------------------------------------------- what the policy launches
def _cache() -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.empty(NUM_BLOCKS, BLOCK, KV_HEADS, HEAD_DIM, dtype=BF16),
            torch.empty(NUM_BLOCKS, BLOCK, KV_HEADS, HEAD_DIM, dtype=BF16))


def _caches() -> list[dict[str, torch.Tensor | None]]:
    """The KV caches the kernels take: bf16, and FP8 with its scales (--kv-cache-dtype fp8) where the
    target converts e4m3 (sm_89 and later: engine/load.py refuses it below)."""
    from osserve.ops.attention.fp8_triton import MIN_CAPABILITY
    from osserve.ops.attention.kv_format import FP8_DTYPE, KVCache
    from osserve.ops.policy import kernel_policy

    k, v = _cache()
    caches: list[dict[str, torch.Tensor | None]] = [dict(k_cache=k, v_cache=v, k_scales=None, v_scales=None)]
    capability = kernel_policy(torch.device("cuda")).capability
    if capability is not None and capability >= MIN_CAPABILITY:
        fp8 = KVCache.allocate(NUM_BLOCKS, BLOCK, KV_HEADS, HEAD_DIM, FP8_DTYPE, "cpu")
        caches.append(dict(k_cache=fp8.k, v_cache=fp8.v, k_scales=fp8.k_scales, v_scales=fp8.v_scales))
    return caches


def _prepared() -> Any:
    """Experts in the Triton kernels' layout (ops/moe/layout.py), unwritten: scales group-major."""
    from osserve.ops.moe.weights import PreparedExperts

    u8 = torch.uint8
    return PreparedExperts(
        w1=torch.empty(E, 2 * I, H // 2, dtype=u8), s1=torch.empty(E, H // 32, 2 * I, dtype=u8).transpose(1, 2),
        b1=torch.empty(E, 2 * I), w2=torch.empty(E, H, I // 2, dtype=u8),
        s2=torch.empty(E, I // 32, H, dtype=u8).transpose(1, 2), b2=torch.empty(E, H))


def _routing(t: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.stack([torch.randperm(E)[:K] for _ in range(t)]) if t else torch.empty(0, K, dtype=torch.int64)
    return torch.full((t, K), 1.0 / K, dtype=BF16), ids


def attention(sms: int) -> None:
    from osserve.ops.attention.decode_triton import paged_decode_triton
    from osserve.ops.attention.paged_triton import _prefill, write_kv_triton

    sinks = torch.empty(HEADS, dtype=BF16)
    for c in _caches():
        scales = dict(k_scales=c["k_scales"], v_scales=c["v_scales"])
        k_cache, v_cache = c["k_cache"], c["v_cache"]
        assert k_cache is not None and v_cache is not None
        for t, window in ((512, None), (512, 128)):  # a prompt: full and sliding layers
            q = torch.empty(t, HEADS, HEAD_DIM, dtype=BF16)
            starts, lengths = torch.tensor([0, t], dtype=torch.int32), torch.tensor([t], dtype=torch.int32)
            _prefill(q, k_cache, v_cache, sinks, starts, lengths, torch.zeros(1, 40, dtype=torch.int32), 0.125, window,
                     t, torch.empty_like(q), **scales)
            kv = torch.empty(t, KV_HEADS, HEAD_DIM, dtype=BF16)
            write_kv_triton(kv, kv, k_cache, v_cache, torch.zeros(t, dtype=torch.int64), **scales)
        for b, context, window in ((1, 32768, None), (1, 32768, 128), (32, 4096, None)):  # decode
            q = torch.empty(b, HEADS, HEAD_DIM, dtype=BF16)
            splits = _splits_on(sms, b, context if window is None else window)
            paged_decode_triton(q, k_cache, v_cache, sinks, torch.arange(b + 1, dtype=torch.int32),
                                torch.full((b,), context, dtype=torch.int32), torch.zeros(b, 40, dtype=torch.int32),
                                0.125, window, context, torch.empty_like(q), num_splits=splits, **scales)


def _splits_on(sms: int, b: int, context: int) -> int:
    """decode_triton.choose_num_splits on a GPU of `sms` SMs (it reads the device's own count)."""
    from osserve.ops.attention import decode_triton

    return decode_triton.splits_within_bounds(triton.cdiv(2 * sms, max(1, b * KV_HEADS)), context)


def norms_and_rope(sms: int) -> None:
    from osserve.ops.norm.norm_triton import add_rms_norm_triton, embed_rms_norm_triton
    from osserve.ops.rope.qkv_rope_triton import qkv_rope_cache_triton
    from osserve.ops.rope.rope_triton import rope_and_cache_triton

    w = torch.empty(H, dtype=BF16)
    cos = sin = torch.empty(4096, HEAD_DIM // 2)
    for t in (1, 32, 512):
        residual = torch.empty(t, H, dtype=BF16)
        add_rms_norm_triton(torch.empty(t, H, dtype=BF16), residual, w, 1e-5)
        add_rms_norm_triton(torch.empty(2, t, K, H), residual, w, 1e-5)  # the MoE's split, unreduced rows
        add_rms_norm_triton(torch.empty(3, t, 1, H), residual, w, 1e-5)  # o_proj's K split
        ids = torch.zeros(t, dtype=torch.int64)
        embed_rms_norm_triton(ids, torch.empty(VOCAB, H, dtype=BF16), w, 1e-5)
        embed_rms_norm_triton(ids, torch.empty(VOCAB, H, dtype=BF16), w, 1e-5, ids, ids)  # async scheduling
        positions, slots = torch.zeros(t, dtype=torch.int64), torch.zeros(t, dtype=torch.int64)
        for c in _caches():  # bf16 and FP8 caches
            k_cache, v_cache, k_scales, v_scales = c["k_cache"], c["v_cache"], c["k_scales"], c["v_scales"]
            assert k_cache is not None and v_cache is not None
            if t <= 32:
                qkv = torch.empty((HEADS + 2 * KV_HEADS) * HEAD_DIM, H, dtype=BF16)
                qkv_rope_cache_triton(torch.empty(t, H, dtype=BF16), qkv, torch.empty(qkv.shape[0], dtype=BF16),
                                      HEADS, KV_HEADS, cos, sin, positions, k_cache, v_cache, slots, k_scales, v_scales)
            else:
                rope_and_cache_triton(torch.empty(t, HEADS, HEAD_DIM, dtype=BF16),
                                      torch.empty(t, KV_HEADS, HEAD_DIM, dtype=BF16),
                                      torch.empty(t, KV_HEADS, HEAD_DIM, dtype=BF16), cos, sin, k_cache, v_cache,
                                      slots, positions=positions, k_scales=k_scales, v_scales=v_scales)


def router(sms: int) -> None:
    from osserve.ops.router.fused_triton import (
        NormInput,
        router_gemm_topk_triton,
        router_norm_plan_triton,
        router_plan_triton,
    )
    from osserve.ops.router.topk_triton import route_triton

    weight, bias = torch.empty(E, H, dtype=BF16), torch.empty(E, dtype=BF16)
    counters = torch.zeros(64, dtype=torch.int32)
    for t in (1, 4):  # decode: the router also takes the norm and builds the MoE's plan
        a, residual = torch.empty(t, H, dtype=BF16), torch.empty(t, H, dtype=BF16)
        router_norm_plan_triton(NormInput(a, residual, torch.empty(H, dtype=BF16), 1e-5), weight, bias, K, counters, 16)
    router_plan_triton(torch.empty(16, H, dtype=BF16), weight, bias, K, counters, 16)
    router_gemm_topk_triton(torch.empty(100, H, dtype=BF16), weight, bias, K, counters)
    route_triton(torch.empty(1000, H, dtype=BF16), weight, bias, K)


def linear_and_head(sms: int) -> None:
    from osserve.ops.linear.head_triton import HostIds, logits_and_greedy_triton
    from osserve.ops.linear.small_m_triton import small_m_linear_triton, unreduced_splits
    from osserve.ops.sampling.bitmask_triton import apply_token_bitmask_triton
    from osserve.ops.sampling.gumbel_triton import gumbel_argmax_triton

    qkv, o = torch.empty(5120, H, dtype=BF16), torch.empty(H, HEADS * HEAD_DIM, dtype=BF16)
    head = torch.empty(VOCAB, H, dtype=BF16)
    for t in (1, 8, 32):
        small_m_linear_triton(torch.empty(t, H, dtype=BF16), qkv, torch.empty(5120, dtype=BF16))
        small_m_linear_triton(torch.empty(t, HEADS * HEAD_DIM, dtype=BF16), o, torch.empty(H, dtype=BF16),
                              splits=unreduced_splits(H, HEADS * HEAD_DIM, sms))
        host = HostIds(torch.zeros(2, t, dtype=torch.int64), torch.zeros(1, dtype=torch.int32))
        logits_and_greedy_triton(torch.empty(t, H, dtype=BF16), head, host_out=host)
        logits_and_greedy_triton(torch.empty(t, H, dtype=BF16), head)
        gumbel_argmax_triton(torch.empty(t, VOCAB), torch.ones(t), torch.zeros(t, dtype=torch.int64),
                             num_splits=triton.cdiv(4 * sms, t))
        # a grammar's token mask (structured outputs) on the rows that have one
        apply_token_bitmask_triton(torch.empty(t, VOCAB), torch.arange(t, dtype=torch.int32),
                                   torch.zeros(t, triton.cdiv(VOCAB, 32), dtype=torch.int32))


def moe(sms: int) -> None:
    from osserve.ops.moe.dense import moe_prefill_dense
    from osserve.ops.moe.swapped import PROGRAMS_PER_SM, fused_moe_swapped
    from osserve.ops.moe.tiled import fused_moe_triton
    from osserve.ops.moe.weights import ExpertWeights

    prepared = _prepared()
    for t in (1, 8, 64, 128, 1024, 4096):  # decode and mixed steps: each token-tile bucket
        weights, ids = _routing(t)
        for reduce in (True, False):
            fused_moe_swapped(torch.empty(t, H, dtype=BF16), weights, ids, prepared, 7.0,
                              min_programs=PROGRAMS_PER_SM * sms, reduce=reduce)
    weights, ids = _routing(1)  # K split (a GPU of more SMs than the 20b's batch-1 grid fills: the H100)
    fused_moe_swapped(torch.empty(1, H, dtype=BF16), weights, ids, prepared, 7.0, min_programs=PROGRAMS_PER_SM * 132)
    weights, ids = _routing(8192)  # prefill without the checkpoint-layout experts (24-40 GB cards)
    fused_moe_triton(torch.empty(8192, H, dtype=BF16), weights, ids, prepared, 7.0)
    e = 2  # prefill with them (cards of 48 GB and more): the layer dequantised, then grouped GEMMs
    u8 = torch.uint8
    experts = ExpertWeights(torch.zeros(e, 2 * I, H // 32, 16, dtype=u8), torch.zeros(e, 2 * I, H // 32, dtype=u8),
                            torch.zeros(e, 2 * I, dtype=BF16), torch.zeros(e, H, I // 32, 16, dtype=u8),
                            torch.zeros(e, H, I // 32, dtype=u8), torch.zeros(e, H, dtype=BF16))
    ids = torch.tensor([[0, 1]] * 16)
    moe_prefill_dense(torch.zeros(16, H, dtype=BF16), torch.full((16, 2), 0.5, dtype=BF16), ids, experts, 7.0)


def sm90_pieces(sms: int) -> None:
    """One launch of each kind the Hopper policy adds: a PDL launch (griddepcontrol) and the MoE's packed
    dequantiser (mul.rn.bf16x2). Under the portable policy they are ordinary launches of the others."""
    from osserve.ops.moe.swapped import fused_moe_swapped
    from osserve.ops.norm.norm_triton import add_rms_norm_triton

    add_rms_norm_triton(torch.empty(1, H, dtype=BF16), torch.empty(1, H, dtype=BF16), torch.empty(H, dtype=BF16), 1e-5)
    fused_moe_swapped(torch.empty(1, H, dtype=BF16), *_routing(1), _prepared(), 7.0, min_programs=1)


SCENARIOS: dict[str, Callable[[int], None]] = {
    "attention": attention, "norm-rope": norms_and_rope, "router": router, "linear-head-sampling": linear_and_head,
    "moe": moe, "sm90-pieces": sm90_pieces,
}
# What the split heuristics read: A100, A10, L4, H100, B200, RTX 5090
SMS = {(8, 0): 108, (8, 6): 72, (8, 9): 58, (9, 0): 132, (10, 0): 148, (12, 0): 170}


@contextlib.contextmanager
def caught_launches(policy: KernelPolicy, sms: int) -> Iterator[list[tuple[JITFunction, tuple, dict]]]:
    """Inside, under `policy`, every kernel launch is caught before it reaches a driver and listed as
    (function, arguments, keyword arguments); the device reports `sms` SMs."""
    launches: list[tuple[JITFunction, tuple, dict]] = []
    original, properties = JITFunction.run, torch.cuda.get_device_properties

    def catch(self: JITFunction, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        launches.append((self, args, kwargs))

    JITFunction.run = catch  # type: ignore[method-assign]
    # Launchers that size their grids by the SMs (with PDL: the L2 prefetch) ask the device.
    torch.cuda.get_device_properties = lambda *_: SimpleNamespace(multi_processor_count=sms)  # type: ignore[assignment]
    try:
        torch.manual_seed(0)
        with use_policy(policy), torch.inference_mode():
            yield launches
    finally:
        JITFunction.run = original  # type: ignore[method-assign]
        torch.cuda.get_device_properties = properties


def record(policy: KernelPolicy, scenarios: list[str]) -> list[Launch]:
    """Every kernel launch of `scenarios` under `policy`, caught before it reaches a driver."""
    assert policy.capability is not None
    sms = SMS.get(policy.capability, 72)
    launches: list[Launch] = []
    with caught_launches(policy, sms) as caught:
        for scenario in scenarios:
            done = len(caught)
            SCENARIOS[scenario](sms)
            launches += [Launch(scenario, fn, args, kwargs) for fn, args, kwargs in caught[done:]]
    return launches


# --------------------------------------------------------------------------------- compile and read
CONFIG_KEYS = re.compile(r"BLOCK(_[A-Z0-9]+)?|NUM_STAGES|NUM_SPLITS|SPLITS?|HAS_WINDOW|PARTS_[SJ]|FAST|PDL|FP8|"
                         r"num_warps|num_stages")


def config(launch: Launch) -> str:
    return " ".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in launch.kwargs.items()
                    if CONFIG_KEYS.fullmatch(k))


def bind(launch: Launch, target: GPUTarget) -> tuple[ASTSource, dict, str]:
    """(source, options, key) as Triton's JIT binds a launch's arguments for `target`."""
    backend = make_backend(target)
    binder = create_function_from_signature(launch.fn.signature, launch.fn.params, backend)
    bound, specialization, options = binder(*launch.args, **launch.kwargs)
    options, signature, constexprs, attrs = launch.fn._pack_args(backend, launch.kwargs, bound, specialization, options)
    key = f"{launch.fn.__name__}|{signature}|{sorted(constexprs.items())}|{sorted(attrs.items())}|{options}"
    source = GluonASTSource if launch.fn.is_gluon() else ASTSource  # a Gluon kernel states its own layouts
    return source(launch.fn, signature, constexprs, attrs), options.__dict__, key


def resources(cubin: bytes, name: str) -> tuple[int, int]:
    """(registers, spilled bytes) of `name` in a cubin, by the cuobjdump Triton ships. ptxas puts register
    spills in the thread's stack frame (STACK; LOCAL stays 0 for them), so both count."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
    m = re.search(rf"Function {re.escape(name)}:\s*REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", out)
    assert m, out
    return int(m.group(1)), int(m.group(2)) + int(m.group(3))


_JOBS: list[tuple[Launch, str, str]] = []  # (launch, scenarios, target): the forked workers read it


def _compile(index: int) -> Compiled:
    launch, scenarios, target_name = _JOBS[index]
    target = GPUTarget("cuda", 10 * TARGETS[target_name][0] + TARGETS[target_name][1], 32)
    name = launch.fn.__name__
    limit = SHARED_MEMORY_BY_CAPABILITY[TARGETS[target_name]]
    try:
        src, options, _ = bind(launch, target)
        with contextlib.redirect_stdout(io.StringIO()):  # a failed ptxas prints the whole PTX there
            kernel = triton.compile(src, target=target, options=options)
    except Exception as e:  # noqa: BLE001 - a failed compile is this check's result
        lines = str(e).splitlines() or [type(e).__name__]
        # ptxas's own words ("ptxas /tmp/x.ptx, line 9; error : Feature ... requires .target sm_90"), else the first
        said = [re.sub(r"^ptxas \S+, line \d+; ", "", line) for line in lines
                if line.startswith("ptxas ") and re.search(r"error\s*:", line)]
        return Compiled(name, scenarios, config(launch), target_name, False, shared_limit=limit,
                        error=(said or lines)[0].strip()[:300])
    registers, spilled = resources(kernel.asm["cubin"], kernel.metadata.name)
    shared = kernel.metadata.shared
    return Compiled(name, scenarios, config(launch), target_name, shared <= limit, registers, spilled, shared, limit,
                    "" if shared <= limit else f"needs {shared} bytes of shared memory, a block gets {limit}")


def compile_all(policy_of: Callable[[tuple[int, int]], KernelPolicy], targets: list[str],
                scenarios: list[str]) -> list[Compiled]:
    """Record each target's launches under its policy, keep one of each distinct compile, compile them."""
    _JOBS.clear()
    for target_name in targets:
        launches = record(policy_of(TARGETS[target_name]), scenarios)
        target = GPUTarget("cuda", 10 * TARGETS[target_name][0] + TARGETS[target_name][1], 32)
        distinct: dict[str, tuple[Launch, set[str]]] = {}
        for launch in launches:
            key = bind(launch, target)[2]
            distinct.setdefault(key, (launch, set()))[1].add(launch.scenario)
        _JOBS.extend((launch, ", ".join(sorted(s)), target_name) for launch, s in distinct.values())
    with multiprocessing.get_context("fork").Pool(min(len(_JOBS), os.cpu_count() or 1)) as pool:
        return pool.map(_compile, range(len(_JOBS)))


def table(results: list[Compiled]) -> str:
    rows = ["| kernel | launched by | config | target | registers | spilled B | shared B (limit) | status |",
            "|---|---|---|---|---|---|---|---|"]
    for r in sorted(results, key=lambda r: (r.kernel, r.config, r.target)):
        status = "ok" if r.ok else f"FAIL: {r.error}"
        row = (f"| {r.kernel} | {r.scenarios} | {r.config} | {r.target} | {r.registers} | {r.spilled} | "
               f"{r.shared:,} ({r.shared_limit:,}) | {status} |")
        if row not in rows:  # launches that differ only where the table does not look (bias or not, ...)
            rows.append(row)
    return "\n".join(rows)


def summary(results: list[Compiled]) -> str:
    """One row a kernel: per target, the most registers and shared memory over its configs."""
    targets = sorted({r.target for r in results}, key=lambda t: int(t[3:]))
    rows = [f"| kernel | configs | {' | '.join(targets)} |", "|---|---|" + "---|" * len(targets)]
    for kernel in sorted({r.kernel for r in results}):
        mine = [r for r in results if r.kernel == kernel]
        cells = []
        for target in targets:
            at = [r for r in mine if r.target == target]
            worst = "" if all(r.ok for r in at) else " FAIL"
            cells.append(f"{max(r.registers for r in at)} / {max(r.shared for r in at) / 1024:.0f} KB"
                         f"{'' if not any(r.spilled for r in at) else ' spills'}{worst}" if at else "")
        rows.append(f"| {kernel} | {len({r.config for r in mine})} | {' | '.join(cells)} |")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", default="sm_80,sm_86,sm_89")
    ap.add_argument("--control", action="store_true",
                    help="also the Hopper policy's launches for sm_90 (must compile) and sm_86 (its PTX must not)")
    ap.add_argument("--control-scenarios", default=",".join(SCENARIOS),
                    help=f"the scenarios --control compiles (of: {', '.join(SCENARIOS)})")
    ap.add_argument("--json", default=None, help="write every result here")
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        sys.exit("unset TRITON_INTERPRET: the interpreter replaces the kernels this compiles")
    portable = compile_all(lambda cap: decide(cap), args.targets.split(","), list(SCENARIOS))
    print(table(portable))
    print("\nMost registers / shared memory a block of each kernel takes, over its configs:\n")
    print(summary(portable))
    out: dict[str, list[dict]] = {"portable": [asdict(r) for r in portable]}
    failed = [r for r in portable if not r.ok]
    if args.control:
        hopper = compile_all(lambda cap: decide((9, 0), shared_memory=SHARED_MEMORY_BY_CAPABILITY[cap]),
                             ["sm_90", "sm_86"], args.control_scenarios.split(","))
        out["hopper"] = [asdict(r) for r in hopper]
        print("\nThe Hopper policy's launches (control: sm_90 must compile; on sm_86 the sm_90 PTX must fail)")
        print(table([r for r in hopper if r.target == "sm_90" and not r.ok] + [r for r in hopper if r.target == "sm_86"
                                                                              and not r.ok]))
        failed += [r for r in hopper if r.target == "sm_90" and not r.ok]
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    kernels = {r.kernel for r in portable}
    print(f"\n{len(kernels)} kernels, {len(portable)} compiles for {args.targets}: "
          f"{'all fit' if not failed else f'{len(failed)} FAILED'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
