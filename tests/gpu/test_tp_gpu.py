"""Tensor and expert parallelism on GPUs.

(1) One GPU: each rank's share of a MoE layer at gpt-oss-20b shapes (columns padded to 1472, 768
    and 384 at N = 2, 4, 8; or E/N whole experts) through the fused 4-bit kernels, summed over the
    ranks, matches the float32 reference of the whole layer.
(2) One GPU: two ranks on it (gloo, steps eager) serve the tiny checkpoint as close to the float32
    reference of the whole model as one rank does (test_model_gpu.py's yardstick).
(3) Two or more GPUs: the same with NCCL and CUDA graphs (the all-reduces captured), TP 2 and 4,
    with and without expert parallelism, and the dummy 20b at TP 2.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from osserve.config import preset
from osserve.distributed.expert_routing import own_share
from osserve.distributed.layout import ShardLayout
from osserve.distributed.parallel_runner import ParallelRunner
from osserve.engine.load import EngineArgs, build_engine
from osserve.model.checkpoint import fill_random_weights
from osserve.model.weights import build_model, load_model
from osserve.ops.moe import gluon as moe_gluon
from osserve.ops.moe.dispatch import fused_moe
from osserve.ops.moe.layout import prepare_mxfp4_experts
from osserve.ops.moe.reference import moe_reference
from tests.distributed.shards import expert_shard
from tests.gpu.test_model_gpu import (
    LENGTHS,
    agreement,
    decode_one_by_one,
    greedy,
    record_logits,
    reference_logits,
)
from tests.ops.moe_fixtures import random_experts, random_routing

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
several_gpus = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                  reason="needs 2 GPUs")
LIMIT = 7.0


@pytest.fixture(scope="module")
def layer_20b():
    cfg = preset("20b")
    return cfg, random_experts(cfg.num_local_experts, cfg.hidden_size, cfg.intermediate_size, device="cuda")


@pytest.mark.parametrize("n,ep", [(2, False), (4, False), (8, False), (4, True), (8, True)])
@pytest.mark.parametrize("num_tokens", [1, 32, 300])
@pytest.mark.parametrize("fragments", [False, True], ids=["triton", "gluon"])
def test_moe_shares_add_up_at_20b_shapes(layer_20b, n: int, ep: bool, num_tokens: int, fragments: bool) -> None:
    cfg, experts = layer_20b
    if fragments and not moe_gluon.supported(torch.device("cuda"), 64, 64):
        pytest.skip("the Gluon kernel needs a Hopper GPU")
    x = torch.randn(num_tokens, cfg.hidden_size, device="cuda").bfloat16()
    weights, ids = random_routing(num_tokens, cfg.num_local_experts, cfg.num_experts_per_tok, device="cuda")
    ref = moe_reference(x.float(), weights, ids, experts, LIMIT)
    total = torch.zeros_like(ref)
    for rank in range(n):
        layout = ShardLayout.of(cfg, rank, n, ep)
        shard = expert_shard(experts, cfg, layout)
        shard = replace(shard, prepared=prepare_mxfp4_experts(shard, fragments=fragments))
        assert moe_gluon.supported(torch.device("cuda"), cfg.hidden_size, shard.prepared.intermediate) or not fragments
        w, i = own_share(weights, ids, layout.experts) if ep else (weights, ids)
        total += fused_moe(x, w.bfloat16(), i, shard, LIMIT).float()
    assert ((total - ref).norm() / ref.norm()).item() < 1e-2


def check(args: EngineArgs, whole, steps: int = 32) -> None:  # type: ignore[no-untyped-def]
    """The split engine's decode logits against the whole model's float32 reference, as close as
    the whole model's own bf16 reference is (test_model_gpu.check's yardstick), and its greedy
    tokens the reference's argmax as often as one rank's (tiny: >= 85%)."""
    engine = build_engine(args)
    runner = engine.runner
    assert isinstance(runner, ParallelRunner)
    try:
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(0, 199_000, (n,), generator=g).tolist() for n in LENGTHS]
        tokens = greedy(engine, prompts, steps)  # batched, async scheduling, graphs where captured
        recorded: list[torch.Tensor] = []
        record_logits(runner, recorded)
        sequences = decode_one_by_one(engine, prompts)
    finally:
        runner.shutdown()
    fast = torch.cat(recorded).float()
    rows = [slice(len(p) - 1, None) for p in prompts]
    ref_bf16 = torch.cat([reference_logits(whole, q)[r].float() for q, r in zip(sequences, rows, strict=True)])
    whole.float()
    ref = torch.cat([reference_logits(whole, q)[r] for q, r in zip(sequences, rows, strict=True)])
    fast_err = ((fast - ref).norm(dim=1) / ref.norm(dim=1)).median().item()
    bf16_err = ((ref_bf16 - ref).norm(dim=1) / ref.norm(dim=1)).median().item()
    print(f"split decode logits vs fp32: {fast_err:.4f}, bf16 reference {bf16_err:.4f}")
    assert fast_err <= 1.5 * bf16_err + 0.01
    if args.load_format != "dummy":
        exact, close = agreement(whole, prompts, tokens)
        print(f"split greedy tokens vs fp32 argmax: {exact:.3f} exact, {close:.3f} within 0.15")
        assert exact >= 0.85


def test_two_ranks_on_one_gpu_with_gloo(tiny_checkpoint: Path) -> None:
    check(EngineArgs(model=str(tiny_checkpoint), max_model_len=4096, kv_cache_gb=1, tensor_parallel_size=2,
                     distributed_backend="gloo", tp_one_device=True),
          load_model(tiny_checkpoint, "cuda", torch.bfloat16, show_progress=False))


@several_gpus
@pytest.mark.parametrize("n,ep", [(2, False), (2, True), (4, False), (4, True)])
def test_tiny_over_gpus_with_nccl_and_graphs(tiny_checkpoint: Path, n: int, ep: bool) -> None:
    if n > torch.cuda.device_count():
        pytest.skip(f"needs {n} GPUs")
    check(EngineArgs(model=str(tiny_checkpoint), max_model_len=4096, kv_cache_gb=1, tensor_parallel_size=n,
                     enable_expert_parallel=ep),
          load_model(tiny_checkpoint, "cuda", torch.bfloat16, show_progress=False))


@several_gpus
def test_dummy_20b_over_two_gpus() -> None:
    cfg = preset("20b")
    whole = build_model(cfg, "cuda", torch.bfloat16)
    fill_random_weights(whole, cfg, seed=0)
    check(EngineArgs(load_format="dummy", preset="20b", max_model_len=4096, max_num_seqs=64, kv_cache_gb=2,
                     tensor_parallel_size=2), whole)
