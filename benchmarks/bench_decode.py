"""The engine's offline speed on random weights of the real shapes (one GPU), printed as a table.

    python benchmarks/bench_decode.py [--presets 20b,120b] [--out results.json]

For each preset: batch 1 and batch 32 decode (prompt 1024, 512 output tokens, greedy,
ignore_eos), prefill of 8 x 2048 tokens (after one warm-up, the median of three), the kernels of
one prefill step and a per-op breakdown of one batch-1 decode step (PyTorch profiler, CUDA time by
kernel name), and the memory plan. Bandwidth at batch 1 is the bytes one
decode step must read (all non-expert weights + the 4 active experts of every layer + the KV
cache) over the measured step time.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
from collections import defaultdict

import torch

from benchmarks.diag import router_parts
from osserve.bench.latency import LatencyResult, run_once
from osserve.config import preset
from osserve.engine.load import EngineArgs, build_engine
from osserve.model.gpt_oss import GptOssForCausalLM


def bytes_per_decode_token(name: str, context: int) -> float:
    cfg = preset(name)
    h, i = cfg.hidden_size, cfg.intermediate_size
    attn = h * (cfg.q_size + 2 * cfg.kv_size) + cfg.q_size * h  # q, k, v, o weights
    expert = (2 * i * h + h * i) * (0.5 + 1 / 32)  # MXFP4 nibbles + one scale byte per 32
    per_layer = 2 * attn + cfg.num_experts_per_tok * expert + 2 * h * cfg.num_local_experts
    kv = sum(2 * cfg.kv_size * 2 * (min(context, cfg.sliding_window) if cfg.window_of(layer) else context)
             for layer in range(cfg.num_hidden_layers))
    return cfg.num_hidden_layers * per_layer + 2 * cfg.vocab_size * h + kv


def profile_decode_step(engine) -> dict[str, float]:  # type: ignore[no-untyped-def]
    from osserve.engine.core.sampling_params import SamplingParams

    engine.add_request("prof", list(range(1000, 2024)), SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    for _ in range(30):
        engine.step()
    runner, graphs, mixed = engine.runner, engine.runner.graphs, engine.runner.mixed
    runner.graphs = runner.mixed = None  # profile the eager kernels; the decode graph replays the same ones
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        engine.step()
        torch.cuda.synchronize()
    runner.graphs, runner.mixed = graphs, mixed
    while engine.has_unfinished():
        engine.step()
    buckets: dict[str, float] = defaultdict(float)
    events = prof.key_averages()
    print_kernels("decode step", events)
    for ev in events:
        name = ev.key.lower()
        kind = ("attention" if "attn" in name or "attention" in name or "decode" in name or "merge" in name
                else "moe" if "gate_up" in name or "_down_" in name or "align" in name
                else "gemm" if "gemm" in name or "matmul" in name or "cublas" in name or "sm90" in name
                or "linear" in name
                else "norm/elementwise" if "elementwise" in name or "reduce" in name or "vectorized" in name
                else "kv write" if "write_kv" in name
                else "other")
        buckets[kind] += ev.device_time_total / 1000.0  # ms
    return dict(buckets)


def print_kernels(label: str, events) -> None:  # type: ignore[no-untyped-def]
    """The 24 kernels with the most GPU time in a profile: total µs, launches, name."""
    kernels = sorted(((ev.device_time_total, ev.count, ev.key) for ev in events if ev.device_time_total), reverse=True)
    print(f"{label} kernels ({sum(k[0] for k in kernels) / 1000:.1f} ms; us total, launches, name): "
          + "; ".join(f"{us:.0f} {n}x {name[:48]}" for us, n, name in kernels[:24]), flush=True)


def profile_prefill_step(engine) -> None:  # type: ignore[no-untyped-def]
    """The kernels of one 8 x 2048-token prefill step (eager: prefill runs outside the graphs)."""
    from osserve.engine.core.sampling_params import SamplingParams

    for i in range(8):
        prompt = [(1000 + 7 * i + j) % 50000 for j in range(2048)]
        engine.add_request(f"prefill-prof-{i}", prompt, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        engine.step()
        torch.cuda.synchronize()
    while engine.has_unfinished():
        engine.step()
    print_kernels("prefill step", prof.key_averages())


def moe_bandwidth(name: str) -> dict[str, float]:
    """The fused MoE alone at the preset's shapes: µs per layer and GB/s of expert bytes read
    (each expert hit counted once) at decode batch 1 and 32."""
    import triton

    from osserve.ops.moe.dispatch import fused_moe
    from tests.ops.moe_fixtures import random_experts

    cfg = preset(name)
    torch.manual_seed(0)
    layers = [random_experts(cfg.num_local_experts, cfg.hidden_size, cfg.intermediate_size, "cuda")
              for _ in range(4)]  # rotate 4 layers' weights so L2 does not hold them
    from osserve.ops.moe import gluon as moe_gluon
    from osserve.ops.moe.layout import prepare_mxfp4_experts

    fragments = moe_gluon.supported(torch.device("cuda"), cfg.hidden_size, cfg.intermediate_size)
    for ex in layers:
        ex.prepared = prepare_mxfp4_experts(ex, fragments=fragments)
        ex.gate_up_blocks = ex.gate_up_scales = ex.down_blocks = ex.down_scales = None
    per_expert = 3 * cfg.hidden_size * cfg.intermediate_size * (0.5 + 1 / 32)
    out = {}
    for t in (1, 32):
        x = torch.randn(t, cfg.hidden_size, device="cuda", dtype=torch.bfloat16)
        logits = torch.randn(t, cfg.num_local_experts, device="cuda")
        w, ids = torch.topk(logits, 4, dim=-1)
        w = torch.softmax(w, -1).bfloat16()
        hit = ids.unique().numel()
        it = iter(range(10**9))
        ms = triton.testing.do_bench(lambda x=x, w=w, ids=ids, it=it: fused_moe(x, w, ids, layers[next(it) % 4], 7.0),
                                     return_mode="median")
        out[f"b{t}_us"] = ms * 1000
        out[f"b{t}_GBps"] = hit * per_expert / (ms / 1000) / 1e9
    return out


AB_VARIANTS = {"router": ("cublas-router", "fused-router"), "moe": ("token-tiled-moe", "swapped-moe"),
               "async": ("sync-steps", "async-steps"), "kernel": ("baseline-moe-kernel", "current-moe-kernel"),
               "linear": ("cublas-qkv-apart", "fused-qkv-small-m"),
               "gluon": ("triton-swapped-moe", "gluon-moe"), "pdl": ("no-pdl", "pdl"),
               "prefetch": ("pdl-no-prefetch", "pdl-prefetch"), "copy-warp": ("no-copy-warp", "copy-warp"),
               "router-splits": ("router-splits-8", "router-splits-1", "router-splits-2", "router-splits-4",
                                 "router-splits-16"),
               "router-splits-more": ("router-splits-8", "router-splits-16", "router-splits-32", "router-splits-45"),
               "attn-partition": ("attn-partition-256", "attn-partition-128", "attn-partition-512",
                                  "attn-partition-1024"),
               "down-per-sm": ("down-per-sm-2", "down-per-sm-1", "down-per-sm-3", "down-per-sm-4"),
               "prefetch-lines": ("prefetch-lines-8", "prefetch-lines-16", "prefetch-lines-32", "prefetch-lines-64"),
               "leave-out": ("keep-all", "leave-out-input-norm", "leave-out-attention", "leave-out-router",
                             "leave-out-moe"),
               "merge-twice": ("keep-all", "merge-twice")}


def leave_out(variant: str) -> None:
    """--ab leave-out: a stage of every decoder layer replaced by no kernel at all, so that the TPOT
    difference is that stage's cost on the step's critical path in the CUDA graph, overlaps included
    (the method the device notes give where there is no timeline profiler). The outputs are garbage:
    for timing only. input-norm also drops the final norm (1 launch of 25); router returns the
    routing (and plan) of its first call per batch size, so a graph captured first keeps one router."""
    import osserve.model.gpt_oss as model

    real = CURRENT.setdefault("leave-out", (model.add_rms_norm, model.paged_attention,
                                            model.add_norm_route_with_plan, model.fused_moe))
    model.add_rms_norm, model.paged_attention, model.add_norm_route_with_plan, model.fused_moe = real
    import osserve.ops.attention.decode_triton as decode_attention

    merge = CURRENT.setdefault("merge", (decode_attention._merge_kernel,))[0]
    decode_attention._merge_kernel = _Twice(merge) if variant == "merge-twice" else merge
    routes: dict[int, tuple] = {}

    def cached_route(a, residual, *args):  # type: ignore[no-untyped-def]
        if residual.shape[0] not in routes:
            routes[residual.shape[0]] = real[2](a, residual, *args)[2:]
        return (residual, residual, *routes[residual.shape[0]])

    if variant == "leave-out-input-norm":
        model.add_rms_norm = lambda h, residual, weight, eps: (residual, residual)
    elif variant == "leave-out-attention":
        model.paged_attention = lambda q, *args: q
    elif variant == "leave-out-router":
        model.add_norm_route_with_plan = cached_route
    elif variant == "leave-out-moe":
        model.fused_moe = lambda x, *args, **kwargs: x.view(1, x.shape[0], 1, x.shape[1])


class _Twice:
    """A Triton kernel launched twice per launch (merge-twice: the split-KV attention's merge, which
    reads the partials and writes the same output again), so that the TPOT difference is one more
    such launch on the step's critical path: the price of the merge's own launch."""

    def __init__(self, kernel) -> None:  # type: ignore[no-untyped-def]
        self.kernel = kernel

    def __getitem__(self, grid: object):  # type: ignore[no-untyped-def]
        def launch(*args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            self.kernel[grid](*args, **kwargs)
            self.kernel[grid](*args, **kwargs)

        return launch


def set_variant(variant: str, baseline_path: str | None) -> None:
    """The A/B switches, for this script only: module-level names the dispatchers read per call.
    baseline-moe-kernel runs an older moe/swapped.py (bench_moe_decode.load_baseline) on
    row-major scales in place of the current swapped kernel."""
    import osserve.ops.attention.decode_triton as decode_attention
    import osserve.ops.linear.small_m_triton as linear_triton
    import osserve.ops.moe.gluon as moe_gluon
    import osserve.ops.moe.gluon_tiles as moe_choices
    import osserve.ops.moe.layout as moe_layout
    import osserve.ops.moe.swapped as moe_swapped
    import osserve.ops.pdl as pdl
    import osserve.ops.router.fused_triton as fused_router
    from benchmarks.bench_moe_decode import load_baseline

    fused_router.FUSED_MAX_TOKENS = 0 if variant == "cublas-router" else 128
    # Numbered variants ("router-splits-16") set a module constant; the others restore its default.
    numbered = {"router-splits-": (fused_router, "H_SPLITS_ONE_BLOCK"),
                "attn-partition-": (decode_attention, "MIN_PARTITION"),
                "down-per-sm-": (moe_choices, "DOWN_PROGRAMS_PER_SM"),
                "prefetch-lines-": (linear_triton, "PREFETCH_LINES")}
    for prefix, (module, name) in numbered.items():
        default = CURRENT.setdefault(prefix, (getattr(module, name),))[0]
        setattr(module, name, int(variant.removeprefix(prefix)) if variant.startswith(prefix) else default)
    leave_out(variant)
    pdl.ENABLED = variant != "no-pdl"
    pdl.PREFETCH = variant != "pdl-no-prefetch"
    moe_choices.COPY_WARP = variant != "no-copy-warp"
    moe_swapped.MAX_TOKENS = 0 if variant == "token-tiled-moe" else 4096
    linear_triton.MAX_TOKENS = 0 if variant == "cublas-qkv-apart" else 32
    fuse = CURRENT.setdefault("fuse", (GptOssForCausalLM.fuse_qkv,))[0]
    GptOssForCausalLM.fuse_qkv = (lambda self: None) if variant == "cublas-qkv-apart" else fuse  # type: ignore[method-assign]
    supported = CURRENT.setdefault("gluon", (moe_gluon.supported,))[0]
    triton_moe = variant in ("triton-swapped-moe", *AB_VARIANTS["moe"], *AB_VARIANTS["kernel"])  # the older A/Bs
    moe_gluon.supported = (lambda *a: False) if triton_moe else supported  # type: ignore[assignment]
    current = CURRENT.setdefault("kernel", (moe_swapped.fused_moe_swapped, moe_layout._group_major))
    if variant == "baseline-moe-kernel":
        baseline = load_baseline(baseline_path)
        assert baseline is not None, "--ab kernel needs --baseline FILE"
        moe_swapped.fused_moe_swapped, moe_layout._group_major = baseline.fused_moe_swapped, lambda t: t
    else:
        moe_swapped.fused_moe_swapped, moe_layout._group_major = current


CURRENT: dict[str, tuple] = {}  # the swapped kernel and the scale layout, before any switch


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", default="20b")
    ap.add_argument("--out", default=None)
    ap.add_argument("--output-len", type=int, default=512)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.90)
    ap.add_argument("--skip", default="", help="comma list of: b32,prefill,profile,moe")
    ap.add_argument("--ab", choices=sorted(AB_VARIANTS), default=None,
                    help="each preset twice, old path then new: linear (cuBLAS with q, k, v apart vs q/k/v "
                         "fused and the small-M Triton linear), router (cuBLAS + top-k kernel vs the fused "
                         "small-batch kernel), moe (token-tiled kernel at decode vs the swapped one) or async "
                         "(each step finished before the next is scheduled vs async scheduling) or kernel "
                         "(an older moe/swapped.py, --baseline, vs the current one) or gluon (the Triton swapped "
                         "kernel vs the Gluon one) or pdl (kernels launched one after the other vs with "
                         "programmatic dependent launch, ops/pdl.py) or prefetch (with PDL, the kernels "
                         "without vs with their L2 prefetches before the wait) or copy-warp (the MoE's K loops "
                         "without vs with a copy warp at batch 1-2, moe/gluon_ws.py) or router-splits / "
                         "router-splits-more (the fused router's H splits for one token block: 8, then 1, 2, 4, "
                         "16; 8, 16, 32, 45) or attn-partition (decode attention's MIN_PARTITION: 256, then "
                         "128, 512, 1024) or down-per-sm (the down GEMM's K split to 2, then 1, 3, 4 programs an "
                         "SM) or prefetch-lines (the projections' L2 prefetch before the wait: 8, then 16, 32, 64 "
                         "lines a row) or leave-out (each decoder layer without one stage: input norm, "
                         "attention, router, MoE; garbage outputs, for each stage's cost on the critical path) or "
                         "merge-twice (the split-KV attention's merge launched twice: the price of its launch)")
    ap.add_argument("--variant", default=None,
                    help="one variant, in place of --ab's list: any --ab variant, or one of "
                         f"router_parts.VARIANTS {', '.join(router_parts.VARIANTS)} (one per process)")
    ap.add_argument("--baseline", default=None, help="for --ab kernel: the older moe/swapped.py")
    args = ap.parse_args()
    rows, results = [], {}
    variants = (args.variant,) if args.variant else AB_VARIANTS[args.ab] if args.ab else ("",)
    if args.variant in router_parts.VARIANTS:
        router_parts.apply(args.variant)
    runs = [(p, v) for p in args.presets.split(",") for v in variants]
    for name, variant in runs:
        set_variant(variant, args.baseline)
        label = f"{name}/{variant}" if variant else name
        engine = build_engine(EngineArgs(load_format="dummy", preset=name, max_model_len=8192, max_num_seqs=64,
                                         max_num_batched_tokens=16384,
                                         gpu_memory_utilization=args.gpu_memory_utilization,
                                         no_async_scheduling=variant == "sync-steps"))
        skip = set(args.skip.split(","))
        empty = LatencyResult(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, None)
        run_once(engine, 1, 128, 16, seed=99)  # warm-up: compile every kernel
        b1 = run_once(engine, 1, 1024, args.output_len, seed=1)
        b32 = empty if "b32" in skip else run_once(engine, 32, 1024, args.output_len, seed=2)
        if "prefill" not in skip:  # once to warm whatever 8 x 2048 meets first, then measured
            logging.info("prefill warm-up: %.0f tok/s", run_once(engine, 8, 2048, 2, seed=4).prefill_tok_s)
        pre = empty
        if "prefill" not in skip:  # the median of three (each prompt set routes differently)
            runs = sorted((run_once(engine, 8, 2048, 2, seed=s) for s in (3, 5, 6)), key=lambda r: r.prefill_tok_s)
            logging.info("prefill runs: %s tok/s", ", ".join(f"{r.prefill_tok_s:.0f}" for r in runs))
            pre = runs[1]
        if "profile" not in skip and "prefill" not in skip:
            profile_prefill_step(engine)
        breakdown = {} if "profile" in skip else profile_decode_step(engine)
        moe = {"b1_us": 0.0, "b1_GBps": 0.0, "b32_GBps": 0.0} if "moe" in skip else moe_bandwidth(name)
        need = bytes_per_decode_token(name, 1024 + args.output_len // 2)
        bw = need / (b1.tpot_median_ms / 1000) / 1e12
        results[label] = {"batch1": vars(b1), "batch32": vars(b32), "prefill_8x2048": vars(pre),
                         "decode_step_breakdown_ms": breakdown, "bytes_per_token": need,
                         "batch1_TBps": bw, "moe_alone": moe, "peak_gib": torch.cuda.max_memory_allocated() / 2**30}
        rows.append((label, b1.decode_tok_s, b1.tpot_median_ms, bw, b32.decode_tok_s, pre.prefill_tok_s,
                     torch.cuda.max_memory_allocated() / 2**30, moe["b1_us"], moe["b1_GBps"], moe["b32_GBps"]))
        print(label, json.dumps(results[label], indent=1), flush=True)
        del engine
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
    print(f"\n{torch.cuda.get_device_name()}")
    print(f"{'preset':>20} {'b1 tok/s':>9} {'b1 TPOT ms':>10} {'b1 TB/s':>8} {'b32 tok/s':>10} "
          f"{'prefill tok/s':>13} {'peak GiB':>9} {'MoE b1 us':>9} {'MoE b1 GB/s':>11} {'MoE b32 GB/s':>12}")
    for r in rows:
        print(f"{r[0]:>20} {r[1]:>9.1f} {r[2]:>10.3f} {r[3]:>8.2f} {r[4]:>10.1f} {r[5]:>13.0f} {r[6]:>9.1f} "
              f"{r[7]:>9.1f} {r[8]:>11.0f} {r[9]:>12.0f}")


if __name__ == "__main__":
    main()
