"""Speculative decoding through the engine on the tiny random checkpoint (CPU): lossless.

The checkpoint is the tiny one with its head cut down to 64 tokens (the others' rows zeroed), so its
text repeats itself and prompt lookup finds drafts. A random draft accepts almost nothing, so these
tests also let the benchmark's acceptance oracle
(speculative/oracle.py) set most drafted tokens to the target's own greedy continuation (recorded by
a plain run): drafts are then accepted several at a time, on any branch of a tree, and rejected at
random depths, which is what the verification, the KV moves and the scheduler's rollback must
survive. The outputs must equal the plain engine's token for token: n-gram, EAGLE3 chain and
EAGLE3 tree; batched and staggered; with chunked prefill, preemption, the prefix cache (no rejected
draft's KV is ever served from it) and across the 128-token sliding window. With temperature > 0 the
output distribution must be the target's (a chi-square test against its exact probabilities)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from osserve.config import preset
from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.engine import LLMEngine
from osserve.engine.load import EngineArgs, build_engine
from osserve.errors import ConfigError
from osserve.model.checkpoint import write_checkpoint
from osserve.model.eagle3 import Eagle3Config
from osserve.model.eagle3_weights import write_random_draft
from osserve.speculative.eagle import Eagle3Proposer
from osserve.speculative.oracle import AcceptanceOracle
from tests.engine.test_engine import prompts, run

MAX_TOKENS = 16
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
TINY = preset("tiny")


NARROW = 64  # tokens the head can pick
MIN_P = 0.3


@pytest.fixture(scope="module")
def narrow(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("narrow")
    for f in tiny_checkpoint.iterdir():
        if f.suffix == ".safetensors":
            tensors = load_file(str(f))
            if "lm_head.weight" in tensors:
                tensors["lm_head.weight"][NARROW:] = 0
            save_file(tensors, str(out / f.name), metadata={"format": "pt"})
        else:
            (out / f.name).write_bytes(f.read_bytes())
    return out


@pytest.fixture(scope="module")
def draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = Eagle3Config(hidden_size=128, intermediate_size=256, num_attention_heads=8, num_key_value_heads=1,
                       head_dim=64, vocab_size=TINY.vocab_size, draft_vocab_size=4096, aux_layer_ids=(1, 2, 3))
    return write_random_draft(TINY, tmp_path_factory.mktemp("draft"), seed=5, cfg=cfg)


def spec_configs(draft: Path) -> dict[str, dict[str, Any]]:
    return {"ngram": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4},
            "chain": {"method": "eagle3", "model": str(draft), "num_speculative_tokens": 3},
            "tree": {"method": "eagle3", "model": str(draft), "num_speculative_tokens": 3, "topk": 3,
                     "num_draft_tokens": 8}}


def engine(ckpt: Path, spec: dict[str, Any] | None = None, **kw: Any) -> LLMEngine:
    return build_engine(EngineArgs(model=str(ckpt), device="cpu", max_model_len=1024, speculative_config=spec, **kw))


def workload() -> list[list[int]]:
    """Short and long prompts of the head's tokens, two crossing the 128-token window as they decode."""
    ps = [[t % NARROW for t in p] for p in prompts(6, seed=4)]
    ps[1] = (ps[1] * 4)[:120]
    ps[2] = (ps[2] * 2)[:125]
    return ps


@pytest.fixture(scope="module")
def plain(narrow: Path) -> dict[str, list[int]]:
    return run(engine(narrow), workload(), GREEDY)


def drafting(eng: LLMEngine) -> set[str]:
    """The ids of the requests that verify drafts from now on (filled as the engine runs)."""
    spec = eng.spec
    assert spec is not None
    seen: set[str] = set()
    real = spec.verify

    def verify(logits: torch.Tensor, requests: list[Any], generators: Any) -> Any:
        seen.update(r.request_id for r in requests)
        return real(logits, requests, generators)

    spec.verify = verify  # type: ignore[method-assign]
    return seen


def with_oracle(eng: LLMEngine, plain: dict[str, list[int]], accept: float = 0.8, seed: int = 0) -> LLMEngine:
    assert eng.spec is not None
    eng.spec.oracle = AcceptanceOracle(plain, accept, TINY.vocab_size, seed)
    return eng


@pytest.mark.parametrize("method", ["ngram", "chain", "tree"])
def test_greedy_outputs_equal_plain_decoding(narrow: Path, draft: Path, plain: dict[str, list[int]],
                                             method: str) -> None:
    eng = with_oracle(engine(narrow, spec_configs(draft)[method]), plain)
    assert run(eng, workload(), GREEDY) == plain
    stats = eng.stats()
    assert stats.spec_num_accepted_tokens > 0 and stats.spec_accepted_per_position is not None
    if method != "ngram":  # every EAGLE3 request drafts every step: tokens came several at a time
        assert stats.spec_accepted_per_position[1] > 0
        assert stats.generation_tokens_total == sum(len(v) for v in plain.values())
    assert all(eng.kv.num_free_blocks(g) == eng.kv.num_blocks(g) for g in eng.kv.groups)


@pytest.mark.parametrize("method", ["chain", "tree"])
def test_staggered_chunked_and_preempted(narrow: Path, draft: Path, plain: dict[str, list[int]],
                                         method: str) -> None:
    cfg = spec_configs(draft)[method]
    eng = with_oracle(engine(narrow, cfg, max_num_batched_tokens=24, no_prefix_caching=True), plain, seed=1)
    assert run(eng, workload(), GREEDY, stagger=2) == plain
    eng = with_oracle(engine(narrow, cfg, num_blocks=28, no_prefix_caching=True), plain, seed=2)
    assert run(eng, workload(), GREEDY) == plain
    assert eng.scheduler.num_preemptions > 0 and eng.stats().spec_num_accepted_tokens > 0


def test_decode_first_chunks_prompts_beside_requests_verifying_drafts(narrow: Path, draft: Path,
                                                                     plain: dict[str, list[int]]) -> None:
    """Decode-first (engine/core/decode_first.py) at an 8-token chunk: the staggered workload's
    prompts come in chunks of at most 8 beside requests that verify drafts (each a decode, its drafts
    set aside in the step's budget before any prompt token), and the outputs do not change."""
    eng = with_oracle(engine(narrow, spec_configs(draft)["tree"], decode_first_chunk=8, decode_first_min_decodes=1),
                      plain, seed=4)
    real = eng.scheduler.schedule
    beside_drafts: list[int] = []  # a step's prompt tokens, where some request verifies drafts in it

    def schedule(skip: Any = (), lookahead: int = 0) -> Any:
        out = real(skip, lookahead)
        prompt = sum(x.num_new_tokens for x in out.scheduled if x.num_new_tokens > 1 and not x.num_drafts)
        if any(x.num_drafts for x in out.scheduled):
            beside_drafts.append(prompt)
        return out

    eng.scheduler.schedule = schedule  # type: ignore[method-assign]
    assert run(eng, workload(), GREEDY, stagger=2) == plain
    assert any(beside_drafts) and max(beside_drafts) <= 8
    assert all(eng.kv.num_free_blocks(g) == eng.kv.num_blocks(g) for g in eng.kv.groups)


def test_rejected_drafts_never_reach_the_prefix_cache(narrow: Path, draft: Path) -> None:
    """A request whose drafts were half rejected leaves its blocks in the cache; a second request
    continuing its text reads them and must decode as it would with no cache at all."""
    first = [t % NARROW for t in prompts(1, seed=9)[0][:40]]
    eng = engine(narrow, spec_configs(draft)["tree"])
    reference = engine(narrow, no_prefix_caching=True)
    out = run(reference, [first], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))["r0"]
    with_oracle(eng, {"r0": out}, accept=0.5, seed=3)
    assert run(eng, [first], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))["r0"] == out
    assert eng.spec is not None and 0 < eng.spec.stats.num_accepted_tokens < eng.spec.stats.num_draft_tokens
    eng.spec.oracle = None
    second = first + out[:36] + [5, 6, 7]
    before = eng.kv.stats.prefix_cache_hits
    got = run(eng, [second], GREEDY)["r0"]
    assert eng.kv.stats.prefix_cache_hits - before >= 64  # blocks holding the first request's output
    assert got == run(reference, [second], GREEDY)["r0"]


def test_a_tree_over_an_fp8_cache_equals_plain_fp8_decoding(narrow: Path, draft: Path) -> None:
    """--kv-cache-dtype fp8 under the EAGLE3 tree: the verify step writes each node's e4m3 codes and
    scales, the accepted nodes' KV moves to the positions after their root (runner.move_kv: codes and
    scales together), and the draft keeps its own one-layer cache in the model's dtype. A token's
    scale is its own, so the outputs equal the plain FP8 run's token for token."""
    plain_fp8 = run(engine(narrow, kv_cache_dtype="fp8"), workload(), GREEDY)
    eng = with_oracle(engine(narrow, spec_configs(draft)["tree"], kv_cache_dtype="fp8"), plain_fp8)
    moved: list[int] = []
    move_kv = eng.runner.move_kv
    eng.runner.move_kv = lambda moves: moved.append(len(moves)) or move_kv(moves)  # type: ignore[method-assign]
    assert run(eng, workload(), GREEDY) == plain_fp8
    assert sum(moved) > 0 and all(kv.fp8 for kv in eng.runner.kv_caches)
    assert eng.spec is not None and eng.stats().spec_accepted_per_position[1] > 0  # type: ignore[index]
    proposer = eng.spec.proposer
    assert isinstance(proposer, Eagle3Proposer) and proposer.kv_cache.k.dtype == torch.float32  # the draft's


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny model with a 512-token vocabulary (every step's sampling touches the vocabulary, and
    the statistical test takes thousands of tokens), and a random draft for it."""
    cfg = replace(TINY, vocab_size=512)
    ckpt = write_checkpoint(cfg, tmp_path_factory.mktemp("v512"), seed=1, show_progress=False)
    return ckpt, write_random_draft(cfg, tmp_path_factory.mktemp("v512-draft"), seed=2, cfg=Eagle3Config(
        hidden_size=128, intermediate_size=256, num_attention_heads=8, num_key_value_heads=1, head_dim=64,
        vocab_size=512, draft_vocab_size=None, aux_layer_ids=(1, 2, 3)))


def test_sampled_outputs_follow_the_target_distribution(small_vocab: tuple[Path, Path]) -> None:
    """Three tokens at temperature 1 with min-p 0.3 from one prompt, 512 samples; the last two come
    from EAGLE3 chain drafts that hold, after the likeliest first token, the least likely tokens the
    target may still pick (accepted or not at random, and a wrong acceptance rule shows most there).
    Their joint against the exact probabilities (the plain engine's top logprobs, min-p applied), by
    a chi-square test."""
    ckpt, draft = small_vocab
    prompt = prompts(1, seed=11)[0][:12]
    prompt = [t % 512 for t in prompt]
    ref = engine(ckpt)

    def kept(ids: list[int]) -> dict[int, float]:
        top = ref_logprobs(ref, ids)
        best = max(lp for _, lp in top)
        probs = {t: math.exp(lp) for t, lp in top if lp >= best + math.log(MIN_P)}
        total = sum(probs.values())
        return {t: p / total for t, p in probs.items()}

    exact: dict[tuple[int, ...], float] = {}
    for a, pa in kept(prompt).items():
        for b, pb in kept(prompt + [a]).items():
            for c, pc in kept(prompt + [a, b]).items():
                exact[(a, b, c)] = pa * pb * pc
    first = kept(prompt)
    drafted = [max(first, key=first.__getitem__)]
    for _ in range(2):
        after = kept(prompt + drafted)
        drafted.append(min(after, key=after.__getitem__))
    eng = engine(ckpt, {"method": "eagle3", "model": str(draft), "num_speculative_tokens": 2}, max_num_seqs=32)
    n = 512
    assert eng.spec is not None
    eng.spec.oracle = AcceptanceOracle({f"s{i}": drafted for i in range(n)}, 1.0, 512)
    torch.manual_seed(0)
    for i in range(n):
        eng.add_request(f"s{i}", prompt, SamplingParams(temperature=1.0, min_p=MIN_P, max_tokens=3, ignore_eos=True,
                                                       stop_token_ids=[]))
    outs: dict[str, list[int]] = {}
    while eng.has_unfinished():
        for d in eng.step():
            outs.setdefault(d.request_id, []).extend(d.new_token_ids)
    counts: dict[tuple[int, ...], int] = {}
    for toks in outs.values():
        counts[tuple(toks)] = counts.get(tuple(toks), 0) + 1
    assert set(counts) <= set(exact), "an outcome the target cannot produce"
    stats = eng.spec.stats
    assert stats.num_drafts >= n and 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    stat = sum((counts.get(k, 0) - n * p) ** 2 / (n * p) for k, p in exact.items())
    p_value = float(torch.special.gammaincc(torch.tensor((len(exact) - 1) / 2, dtype=torch.float64),
                                            torch.tensor(stat / 2, dtype=torch.float64)))
    assert p_value > 1e-3, (counts, exact)


def ref_logprobs(eng: LLMEngine, ids: list[int]) -> list[tuple[int, float]]:
    """The raw top-20 (token, logprob) after `ids`, from a plain engine."""
    eng.add_request("lp", ids, SamplingParams(temperature=0, max_tokens=1, logprobs=20, ignore_eos=True,
                                              stop_token_ids=[]))
    top: list[tuple[int, float]] = []
    while eng.has_unfinished():
        for d in eng.step():
            if d.new_logprobs:
                top = d.new_logprobs[0].top
    return top


def test_requests_speculation_cannot_serve_fall_back(narrow: Path, draft: Path,
                                                    plain: dict[str, list[int]]) -> None:
    """Logprobs and penalties in the same steps as speculating requests: they sample one token a step
    through the sampler, with what they asked for, and no drafts."""
    ps = workload()[:3]
    special = {"r1": SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=2),
               "r2": SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, repetition_penalty=1.3)}
    ref = engine(narrow)
    expected_r2 = run(ref, [ps[2]], special["r2"])["r0"]
    eng = with_oracle(engine(narrow, spec_configs(draft)["chain"]), plain)
    drafted = drafting(eng)
    for i, p in enumerate(ps):
        eng.add_request(f"r{i}", p, SamplingParams(**vars(special.get(f"r{i}", GREEDY))))
    out: dict[str, list[int]] = {}
    logprobs = 0
    while eng.has_unfinished():
        for d in eng.step():
            out.setdefault(d.request_id, []).extend(d.new_token_ids)
            logprobs += len(d.new_logprobs or [])
    assert out["r0"] == plain["r0"] and out["r1"] == plain["r1"] and out["r2"] == expected_r2
    assert logprobs == MAX_TOKENS
    assert drafted == {"r0"} and eng.stats().spec_num_accepted_tokens > 0


def test_speculation_is_off_above_the_batch_limit(narrow: Path, draft: Path,
                                                  plain: dict[str, list[int]]) -> None:
    cfg = dict(spec_configs(draft)["chain"], disable_by_batch_size=5)
    eng = with_oracle(engine(narrow, cfg), plain)
    assert run(eng, workload(), GREEDY) == plain  # 6 requests, all the same length: never at most 5
    assert eng.stats().spec_num_drafts == 0
    assert run(eng, workload()[:5], GREEDY) == {k: v for k, v in plain.items() if k != "r5"}
    assert eng.stats().spec_num_drafts > 0


def test_a_draft_that_does_not_fit_the_target_stops_start_up(narrow: Path, tmp_path: Path) -> None:
    wrong = write_random_draft(preset("20b"), tmp_path / "d20b", cfg=Eagle3Config(
        hidden_size=2880, intermediate_size=64, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
        vocab_size=201088, draft_vocab_size=16, aux_layer_ids=(1, 2, 3)))
    with pytest.raises(ConfigError, match="'hidden_size' is 2880 but the target model's hidden size is 128"):
        engine(narrow, {"method": "eagle3", "model": str(wrong)})
    with pytest.raises(ConfigError, match="'model' is required for method eagle3"):
        engine(narrow, {"method": "eagle3"})
    with pytest.raises(ConfigError, match="unknown key 'num_spec_tokens'"):
        engine(narrow, {"method": "eagle3", "num_spec_tokens": 3})


def with_graph_layouts(eng: LLMEngine) -> LLMEngine:
    """The CUDA-graph paths of speculative steps (engine/worker/verify_graphs.py,
    speculative/eagle_graphs.py) run without capture: the padded fixed-size layouts they replay."""
    from osserve.engine.worker.verify_graphs import VerifyGraphs
    from osserve.speculative.eagle import Eagle3Proposer
    from osserve.speculative.eagle_graphs import DraftGraphs

    spec, runner = eng.spec, eng.runner
    assert spec is not None
    positions = eng.max_model_len + eng.scheduler_config.speculative_slots + 1
    runner.verify_graphs = VerifyGraphs(runner.model, runner.kv_caches, eng.kv.groups, runner.block_size, positions,
                                        4, spec.config.num_draft_tokens, spec.config.is_tree, spec.capture_layers,
                                        captured=False)
    if isinstance(spec.proposer, Eagle3Proposer):
        spec.proposer.graphs = DraftGraphs(spec.proposer, 4, spec.config.num_draft_tokens, positions,
                                           3 * TINY.hidden_size, torch.float32, captured=False)
    return eng


@pytest.mark.parametrize("method", ["chain", "tree"])
def test_the_graph_layouts_equal_plain_decoding(narrow: Path, draft: Path, plain: dict[str, list[int]],
                                                method: str) -> None:
    """Up to 4 requests a step replay (batch sizes 1, 2, 4: one padded request at 3); the 6 of the
    workload start beyond that and run eagerly until two finish."""
    eng = with_graph_layouts(with_oracle(engine(narrow, spec_configs(draft)[method]), plain, seed=4))
    calls = {"verify": 0, "draft": 0}
    assert eng.runner.verify_graphs is not None
    verify_run, graphs = eng.runner.verify_graphs.run, getattr(eng.spec.proposer, "graphs", None)  # type: ignore[union-attr]

    def counting_verify(*args: Any) -> Any:
        calls["verify"] += 1
        return verify_run(*args)

    eng.runner.verify_graphs.run = counting_verify  # type: ignore[method-assign]
    if graphs is not None:
        draft_run = graphs.run

        def counting_draft(*args: Any) -> Any:
            calls["draft"] += 1
            return draft_run(*args)

        graphs.run = counting_draft
    assert run(eng, workload(), GREEDY, stagger=3) == plain
    assert calls["verify"] > 5 and calls["draft"] > 5 and eng.stats().spec_num_accepted_tokens > 0


def test_grammar_requests_sample_their_masked_token_beside_speculating_ones(tiny_checkpoint: Path, draft: Path) -> None:
    """An output grammar (structured/) cannot verify drafts: its request samples one masked token a
    step in the same speculative steps, and its output still follows the grammar."""
    import re

    from osserve.structured.grammar import check
    from osserve.structured.spec import StructuredOutputs

    eng = engine(tiny_checkpoint, spec_configs(draft)["chain"])
    drafted = drafting(eng)
    hello = eng.tokenizer.encode("Hello")
    spec = StructuredOutputs(regex=r"[a-f0-9]{4}-[0-9]{2}")
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=24, structured=spec)
    check(spec, params.max_tokens)
    eng.add_request("g", hello, params)
    eng.add_request("p", prompts(1, seed=2)[0][:30], SamplingParams(**vars(GREEDY)))
    out: dict[str, list[int]] = {}
    while eng.has_unfinished():
        for d in eng.step():
            out.setdefault(d.request_id, []).extend(d.new_token_ids)
    text = eng.tokenizer.decode([t for t in out["g"] if t < 199_999])
    assert re.fullmatch(r"[a-f0-9]{4}-[0-9]{2}", text), text
    assert drafted == {"p"}  # only the plain request drafted
