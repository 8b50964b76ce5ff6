"""End to end on the GPU: the fast path (Triton kernels, CUDA graphs, bf16) against the
reference path (plain PyTorch ops, eager) on the same weights.

The yardstick is the reference itself: the same weights upcast to float32 give the exact
answer, and the fast path must be about as close to it as the plain-PyTorch bf16 path is
(random-weight 20b activations are ill-conditioned in bf16: the bf16 reference is itself ~8%
off after one layer, growing with depth; so a fixed tolerance would test the weights, not us).
(1) Decode logits of each prompt's sequence through the graph path: the median over all their
steps of ‖fast − fp32‖/‖fp32‖ ≤ 1.5 × that of the bf16 reference + 0.01 (the median, because a
step where a router near-tie flips in one path and not the other is an outlier for either path).
(2) tiny only (well conditioned): greedy tokens of a mixed batch, teacher-forced against the fp32
reference — the share that is the exact argmax, and within 0.15 logits of it, must be no more than
3 points below the share the plain-PyTorch bf16 path reaches in the same test (and ≥ 85%).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.load import EngineArgs, build_engine
from osserve.engine.worker.kv_tensors import layer_groups
from osserve.ops.dispatch import reference_ops
from tests.model.contiguous import ContiguousCache

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
LENGTHS = (5, 130, 300, 17, 260, 64)


def reference_logits(model, tokens: list[int], kv_dtype: torch.dtype | None = None) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """The plain-PyTorch path's logits over `tokens`, through a cache of kv_dtype (None: the model's)."""
    cache = ContiguousCache(model, 1, len(tokens) + 1, kv_dtype=kv_dtype)
    ids, pos, meta = cache.step([0], [tokens])
    with reference_ops(), torch.inference_mode():
        return model.compute_logits(model(ids, pos, meta, cache.kv))


def greedy(engine, prompts: list[list[int]], steps: int) -> list[list[int]]:  # type: ignore[no-untyped-def]
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True))
    outs: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for d in engine.step():
            outs.setdefault(d.request_id, []).extend(d.new_token_ids)
    return [outs[f"r{i}"] for i in range(len(prompts))]


def decode_one_by_one(engine, prompts: list[list[int]], steps: int = 16) -> list[list[int]]:  # type: ignore[no-untyped-def]
    """Each prompt alone through `engine`, greedy for `steps` tokens; each returned as the prompt and
    its tokens but the last: the sequence whose rows from len(prompt) - 1 on are the steps' logits
    (the prefill's last row, then a row per decode step)."""
    sequences = []
    for i, prompt in enumerate(prompts):
        engine.add_request(f"one-{i}", prompt, SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True))
        one: list[int] = []
        while engine.has_unfinished():
            for d in engine.step():
                one.extend(d.new_token_ids)
        sequences.append(prompt + one[:-1])
    return sequences


def record_logits(runner, recorded: list[torch.Tensor], on_host: list[int] | None = None) -> None:  # type: ignore[no-untyped-def]
    """Make `runner` append a copy of every step's logits (the sampled rows) to `recorded` (a
    graph's output buffers are overwritten by its next replay), and check each step's greedy ids,
    where the head computed them (ops/linear/head_triton.py, inside the small decode graphs), against
    torch.argmax of those logits, and the copy the head wrote to pinned host memory, where it
    wrote one, against them (each such step counted in `on_host`)."""
    original = runner.run

    def run(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = original(*args, **kwargs)
        recorded.append(out.logits.clone())
        if out.greedy is not None:
            assert torch.equal(out.greedy, out.logits.argmax(-1))
        if out.greedy_host is not None:
            torch.cuda.synchronize()
            assert out.greedy is not None and torch.equal(out.greedy_host, out.greedy.cpu())
            if on_host is not None:
                on_host.append(len(out.greedy_host))
        return out

    runner.run = run


def agreement(model, prompts: list[list[int]], outputs: list[list[int]]) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(share of tokens that are the reference's exact argmax, share within 0.15 logits of it)."""
    exact = close = total = 0
    for p, toks in zip(prompts, outputs, strict=True):
        ref = reference_logits(model, p + toks[:-1])[len(p) - 1:]
        chosen = ref.gather(1, torch.tensor(toks, device="cuda")[:, None])[:, 0]
        margin = ref.max(1).values - chosen
        close += (margin <= 0.15).sum().item()
        exact += (margin == 0).sum().item()
        total += len(toks)
    return exact / total, close / total


def check(args: EngineArgs, steps: int, check_tokens: bool) -> None:
    engine = build_engine(args)
    model = engine.runner.model
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 199_000, (n,), generator=g).tolist() for n in LENGTHS]
    fast_tokens = greedy(engine, prompts, steps)
    assert all(len(t) == steps for t in fast_tokens)
    ref_tokens = None
    if check_tokens:  # the plain-PyTorch bf16 path's own greedy run, eager, same weights
        eager = build_engine(EngineArgs(**{**vars(args), "enforce_eager": True}))
        with reference_ops():
            ref_tokens = greedy(eager, prompts, steps)
        del eager

    # Decode logits of every prompt through the graph path, one sequence at a time (the pooled
    # median over ~100 rows: one 16-step sequence of the random 20b swings by +-0.2 with which
    # router near-ties flip, for either path).
    recorded: list[torch.Tensor] = []
    record_logits(engine.runner, recorded)
    sequences = decode_one_by_one(engine, prompts)
    fast = torch.cat(recorded).float()
    rows = [slice(len(p) - 1, None) for p in prompts]
    ref_bf16 = torch.cat([reference_logits(model, q)[r].float() for q, r in zip(sequences, rows, strict=True)])

    model.float()  # the reference runs in float32 from here on
    ref = torch.cat([reference_logits(model, q)[r] for q, r in zip(sequences, rows, strict=True)])
    fast_err = ((fast - ref).norm(dim=1) / ref.norm(dim=1)).median().item()
    bf16_err = ((ref_bf16 - ref).norm(dim=1) / ref.norm(dim=1)).median().item()
    print(f"decode logits vs fp32: fast path {fast_err:.4f}, bf16 reference {bf16_err:.4f}")
    assert fast_err <= 1.5 * bf16_err + 0.01
    if ref_tokens is not None:
        fast_exact, fast_close = agreement(model, prompts, fast_tokens)
        ref_exact, ref_close = agreement(model, prompts, ref_tokens)
        print(f"greedy tokens vs fp32 argmax: fast {fast_exact:.3f} exact / {fast_close:.3f} within 0.15; "
              f"bf16 reference {ref_exact:.3f} / {ref_close:.3f}")
        assert fast_exact >= min(ref_exact, 1.0) - 0.03 and fast_close >= ref_close - 0.03
        assert fast_exact >= 0.85


def test_tiny_fast_path_matches_reference(tiny_checkpoint: Path) -> None:
    check(EngineArgs(model=str(tiny_checkpoint), max_model_len=4096, kv_cache_gb=1), steps=64, check_tokens=True)


def test_dummy_20b_fast_path_matches_reference() -> None:
    check(EngineArgs(load_format="dummy", preset="20b", max_model_len=4096, max_num_seqs=64, kv_cache_gb=2),
          steps=32, check_tokens=False)


def test_mixed_step_graphs_match_eager_mixed_steps(tiny_checkpoint: Path) -> None:
    """Newcomers joining running decodes: the steps replayed from the mixed-step CUDA graphs give
    tokens as close to the fp32 reference as the same steps run eagerly (--no-mixed-graphs)."""
    args = EngineArgs(model=str(tiny_checkpoint), max_model_len=4096, kv_cache_gb=1)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 199_000, (n,), generator=g).tolist() for n in (5, 130, 17, 60, 200, 9, 33, 250)]

    def staggered(engine) -> list[list[int]]:  # type: ignore[no-untyped-def]
        outs: dict[str, list[int]] = {}
        pending, step = list(enumerate(prompts)), 0
        while pending or engine.has_unfinished():
            if pending and step % 3 == 0:  # a newcomer every third step: mixed steps
                i, p = pending.pop(0)
                engine.add_request(f"r{i}", p, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
            for d in engine.step():
                outs.setdefault(d.request_id, []).extend(d.new_token_ids)
            step += 1
        return [outs[f"r{i}"] for i in range(len(prompts))]

    graphed = build_engine(args)
    replays = []
    run = graphed.runner.mixed.run
    graphed.runner.mixed.run = lambda *a, **k: replays.append(1) or run(*a, **k)  # type: ignore[method-assign]
    with_graphs = staggered(graphed)
    model = graphed.runner.model
    del graphed
    without = staggered(build_engine(EngineArgs(**{**vars(args), "no_mixed_graphs": True})))
    assert len(replays) >= len(prompts) - 1  # every newcomer after the first joined a replayed step
    model.float()
    exact, close = agreement(model, prompts, with_graphs)
    ref_exact, ref_close = agreement(model, prompts, without)
    print(f"mixed graphs {exact:.3f} / {close:.3f}, eager mixed steps {ref_exact:.3f} / {ref_close:.3f}")
    assert exact >= ref_exact - 0.03 and close >= ref_close - 0.03 and exact >= 0.85


def test_a_repeated_prompt_copies_its_cached_last_block(tiny_checkpoint: Path) -> None:
    """Copies of a 63-token prompt join a running decode with CUDA graphs and async scheduling: each
    takes the cached full blocks and a copy of the prompt's last block (engine/core/kv_cache.py), made
    on the device before the step, and computes only its last token, in the decode graph. The
    copies are exact, and the copies' greedy tokens agree with the fp32 reference as a fast-path
    run's must (test_mixed_step_graphs_match_eager_mixed_steps)."""
    engine = build_engine(EngineArgs(model=str(tiny_checkpoint), max_model_len=4096, kv_cache_gb=1))
    runner = engine.runner
    copied: list[str] = []
    copy_blocks = runner.copy_blocks

    def checked_copy(copies):  # type: ignore[no-untyped-def]
        copy_blocks(copies)
        for c in copies:  # right away: a freed source block may be handed out again later
            for layer in layer_groups(runner.model.config)[c.group]:
                assert all(torch.equal(t[c.dst], t[c.src]) for t in runner.kv_caches[layer].tensors())
            copied.append(c.group)

    runner.copy_blocks = checked_copy  # type: ignore[method-assign]
    g = torch.Generator().manual_seed(3)
    prompt, other = (torch.randint(0, 199_000, (n,), generator=g).tolist() for n in (63, 100))
    greedy(engine, [prompt], 4)  # computes the prompt and caches its blocks
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    engine.add_request("other", other, params)
    outs: dict[str, list[int]] = {}
    cached: dict[str, int] = {}
    for step in range(40):
        if step == 3:  # beside a running decode
            before = engine.prompt_tokens_total
            for i in range(4):
                engine.add_request(f"copy{i}", prompt, SamplingParams(**vars(params)))
        for d in engine.step():
            outs.setdefault(d.request_id, []).extend(d.new_token_ids)
            cached[d.request_id] = d.num_cached_tokens
    assert not engine.has_unfinished()
    assert sorted(copied) == ["full"] * 4 + ["sliding"] * 4
    assert [cached[f"copy{i}"] for i in range(4)] == [62] * 4 and engine.prompt_tokens_total - before == 4
    copies = [outs[f"copy{i}"] for i in range(4)]
    assert all(c == copies[0] for c in copies) and len(copies[0]) == 24
    model = runner.model
    model.float()
    exact, close = agreement(model, [prompt], copies[:1])
    print(f"copies against the fp32 reference: {exact:.3f} / {close:.3f}")
    assert exact >= 0.85


FIRST_REQUESTS = """
import sys, triton
from osserve.engine.worker.kv_tensors import layer_groups
from osserve.engine.load import EngineArgs, build_engine
from osserve.server.generation import sampling_params
engine = build_engine(EngineArgs(model=sys.argv[1], max_model_len=4096, kv_cache_gb=1))  # warms up on a GPU
compiled = []
triton.knobs.runtime.jit_post_compile_hook = lambda **kw: compiled.append(kw["repr"].split("[")[0])
for n, group in enumerate((1, 1, 5)):  # a lone request, then a few: the server's default sampling
    for i in range(group):
        engine.add_request(f"r{n}-{i}", list(range(100 + n, 163 + n)),
                           sampling_params(temperature=None, top_p=None, max_tokens=3, seed=None))
    while engine.has_unfinished():
        engine.step()
for i in range(16):  # then a burst of long prompts (steps of 8-16k tokens: the dense MoE path)
    engine.add_request(f"burst-{i}", [(13 * t + i) % 1000 for t in range(1000)],
                       sampling_params(temperature=None, top_p=None, max_tokens=3, seed=None))
while engine.has_unfinished():
    engine.step()
# then 40 streams (more sampled rows than the small-batch logits kernel: bf16 logits), ending one
# by one, and a prompt arriving at each of their steps: mixed steps with 1 to 40 decodes before it
for i in range(40):
    engine.add_request(f"wave-{i}", [(17 * t + i) % 1000 for t in range(50)],
                       sampling_params(temperature=None, top_p=None, max_tokens=2 + i, seed=None))
for i in range(40):
    engine.add_request(f"late-{i}", [(19 * t + i) % 1000 for t in range(200)],
                       sampling_params(temperature=None, top_p=None, max_tokens=1, seed=None))
    engine.step()
while engine.has_unfinished():
    engine.step()
# then 40 harmony turns whose answer is bound to a schema (the mask kernel over bf16 logits)
from osserve.structured.spec import StructuredOutputs
schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
for i in range(40):
    engine.add_request(f"json-{i}", [(23 * t + i) % 1000 for t in range(60)] + [200006, 173781],
                       sampling_params(temperature=None, top_p=None, max_tokens=6, seed=None,
                                       extra={"structured": StructuredOutputs(json_schema=schema, harmony=True)}))
while engine.has_unfinished():
    engine.step()
print("compiled after warm-up:", sorted(set(compiled)))
"""


def test_warm_up_compiles_what_the_first_requests_need(tiny_checkpoint: Path) -> None:
    """After start-up (warm-up included), the first requests a server gets, a lone one first, at
    its default temperature, then a burst of 1,000-token prompts, then 40 streams with a prompt
    arriving at each of their steps, then 40 schema-bound turns, compile no Triton kernel: a fresh
    process, so no other test's compiles count. (Triton specialises on more than the constexprs: a
    pointer's alignment, an integer's divisibility, a tensor's dtype; engine/compile_log.py names
    what a late compile differed in.)"""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", FIRST_REQUESTS, str(tiny_checkpoint)], capture_output=True,
                          text=True, timeout=600, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "compiled after warm-up: []" in done.stdout, done.stdout[-2000:]


@pytest.mark.parametrize("preset", ["tiny", "20b"])
def test_programmatic_dependent_launch_changes_no_bit(preset: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Programmatic dependent launch (ops/pdl.py) changes only when kernels start: the logits of a
    greedy batch (prefill, then decode steps replayed from CUDA graphs) are bit for bit those of the
    same engine launching its kernels one after the other. A kernel that read its predecessor's
    output before the wait would read the previous layer's or step's values, and differ here."""
    from osserve.ops import pdl
    from osserve.ops.policy import detect

    if not detect(torch.device("cuda")).hopper:
        pytest.skip("the portable kernels launch without PDL (ops/policy.py)")
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 199_000, (n,), generator=g).tolist() for n in (5, 300, 64)]

    def run(enabled: bool) -> tuple[list[list[int]], torch.Tensor]:
        monkeypatch.setattr(pdl, "ENABLED", enabled)
        engine = build_engine(EngineArgs(load_format="dummy", preset=preset, max_model_len=4096, max_num_seqs=8,
                                         kv_cache_gb=1))
        assert pdl.pdl_launch(torch.device("cuda")) == enabled
        recorded: list[torch.Tensor] = []
        record_logits(engine.runner, recorded)
        tokens = greedy(engine, prompts, 24)
        del engine
        return tokens, torch.cat(recorded)

    tokens, logits = run(True)
    tokens_without, logits_without = run(False)
    assert tokens == tokens_without
    assert torch.equal(logits, logits_without)


def test_pending_tokens_read_in_the_graph_change_no_bit() -> None:
    """With async scheduling a decode step starts before the host has its input ids; after a step
    whose greedy ids the graph's head wrote, the next graph reads them in its embedding gather
    (engine/worker/cuda_graphs.py). Tokens and logits are bit for bit those of the same engine finishing
    every step before scheduling the next (the ids then come from the host). In both, the decode
    steps' ids reach the host through the head's own write to pinned memory, equal to the ids on
    the device (record_logits)."""
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 199_000, (n,), generator=g).tolist() for n in (9, 200, 33)]

    def run(no_async: bool) -> tuple[list[list[int]], torch.Tensor, int, int]:
        engine = build_engine(EngineArgs(load_format="dummy", preset="tiny", max_model_len=4096, max_num_seqs=8,
                                         kv_cache_gb=1, no_async_scheduling=no_async))
        graphs = engine.runner.graphs
        assert graphs is not None
        in_graph = []
        original = graphs.run

        def run_graph(*args, **kwargs):  # type: ignore[no-untyped-def]
            in_graph.append(kwargs.get("pending_rows") is not None)
            return original(*args, **kwargs)

        graphs.run = run_graph  # type: ignore[method-assign]
        recorded: list[torch.Tensor] = []
        on_host: list[int] = []
        record_logits(engine.runner, recorded, on_host)
        tokens = greedy(engine, prompts, 24)
        del engine
        return tokens, torch.cat(recorded), sum(in_graph), len(on_host)

    tokens, logits, read_in_graph, on_host = run(False)
    tokens_sync, logits_sync, read_in_graph_sync, on_host_sync = run(True)
    assert read_in_graph >= 20 and read_in_graph_sync == 0
    assert on_host >= 20 and on_host_sync >= 20
    assert tokens == tokens_sync
    assert torch.equal(logits, logits_sync)
