"""Which heads, experts and expert columns each rank holds, the start-up checks (N fits the model,
N GPUs, a free rendezvous port), and the rules that cut each checkpoint tensor: the ranks' shares
of a MoE layer add up to the whole layer, and the loader and the dummy weights cut alike."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch

from osserve.config import ModelConfig, preset
from osserve.distributed.collectives import rendezvous_store
from osserve.distributed.expert_routing import own_share
from osserve.distributed.layout import ParallelConfig, ShardLayout, check_parallel_fits
from osserve.distributed.sharding import ZERO, Cut, cut_tensor, rule_for
from osserve.distributed.workers import rank_devices
from osserve.errors import ConfigError
from osserve.model.checkpoint import fill_random_weights
from osserve.model.weights import build_model, load_weights
from osserve.ops.moe.reference import moe_reference
from tests.distributed.shards import expert_shard
from tests.ops.moe_fixtures import random_experts, random_routing


def layouts(cfg: ModelConfig, n: int, ep: bool) -> list[ShardLayout]:
    return [ShardLayout.of(cfg, r, n, ep) for r in range(n)]


@pytest.mark.parametrize("name,n,ep", [(name, n, ep) for name in ("20b", "120b", "tiny") for n in (1, 2, 4, 8)
                                        for ep in (False, True) if (name, n, ep) != ("tiny", 8, False)])
def test_every_head_expert_and_column_is_held(name: str, n: int, ep: bool) -> None:
    """(The tiny model's 4 blocks of columns over 8 ranks are refused: test_refusals_name_the_flag.)"""
    cfg = preset(name)
    ranks = layouts(cfg, n, ep)
    assert [h for r in ranks for h in r.q_heads] == list(range(cfg.num_attention_heads))
    for r in ranks:  # each query head's kv head is held where the query head is
        group = cfg.num_attention_heads // cfg.num_key_value_heads
        assert {h // group for h in r.q_heads} == set(r.kv_heads)
        assert r.local_config(cfg).num_attention_heads * n == cfg.num_attention_heads
    if ep:
        assert [e for r in ranks for e in r.experts] == list(range(cfg.num_local_experts))
        assert all(r.intermediate == cfg.intermediate_size for r in ranks)
    else:
        assert [c for r in ranks for c in r.columns] == list(range(cfg.intermediate_size))
        assert all(r.columns.start % 32 == 0 and len(r.columns) <= r.intermediate for r in ranks)
        assert all(r.intermediate % 64 == 0 for r in ranks) or n == 1


def test_the_padding_of_gpt_oss_expert_columns() -> None:
    """2880 = 90 MXFP4 blocks: whole blocks per rank, padded to 64-column steps."""
    cfg = preset("120b")
    assert [len(r.columns) for r in layouts(cfg, 4, False)] == [704, 736, 704, 736]
    assert {r.intermediate for r in layouts(cfg, 2, False)} == {1472}
    assert {r.intermediate for r in layouts(cfg, 4, False)} == {768}
    assert {r.intermediate for r in layouts(cfg, 8, False)} == {384}
    assert [len(r.experts) for r in layouts(cfg, 8, True)] == [16] * 8


def test_refusals_name_the_flag() -> None:
    cfg = preset("20b")
    with pytest.raises(ConfigError, match="--tensor-parallel-size 3 must divide the model's 64 attention heads"):
        check_parallel_fits(cfg, 3, False)
    with pytest.raises(ConfigError, match="must divide the model's 12 experts"):
        check_parallel_fits(ModelConfig(num_local_experts=12), 8, True)
    with pytest.raises(ConfigError, match="key/value heads"):
        check_parallel_fits(ModelConfig(num_attention_heads=12, num_key_value_heads=3), 2, False)
    with pytest.raises(ConfigError, match="use --enable-expert-parallel"):
        check_parallel_fits(preset("tiny"), 8, False)
    check_parallel_fits(preset("tiny"), 8, True)


def test_rules_cut_heads_and_zero_row_parallel_biases() -> None:
    cfg = preset("20b")
    r1 = ShardLayout.of(cfg, 1, 4, False)
    assert rule_for("model.layers.3.self_attn.q_proj.weight", cfg, r1) == Cut(0, 1024, 2048, 1024)
    assert rule_for("model.layers.3.self_attn.k_proj.bias", cfg, r1) == Cut(0, 128, 256, 128)
    assert rule_for("model.layers.3.self_attn.o_proj.weight", cfg, r1) == Cut(1, 1024, 2048, 1024)
    assert rule_for("model.layers.3.self_attn.sinks", cfg, r1) == Cut(0, 16, 32, 16)
    assert rule_for("model.layers.3.self_attn.o_proj.bias", cfg, r1) == ZERO
    assert rule_for("model.layers.3.self_attn.o_proj.bias", cfg, ShardLayout.of(cfg, 0, 4, False)) is None
    assert rule_for("model.layers.3.mlp.experts.down_proj_bias", cfg, r1) == ZERO
    assert rule_for("model.layers.3.mlp.experts.down_proj_blocks", cfg, r1) == Cut(2, 22, 45, 24)
    assert rule_for("model.layers.3.mlp.experts.gate_up_proj_scales", cfg, r1) == Cut(1, 1408, 2880, 1536)
    ep = ShardLayout.of(cfg, 1, 4, True)
    assert rule_for("model.layers.3.mlp.experts.down_proj_bias", cfg, ep) == Cut(0, 8, 16, 8)
    for name in ("model.embed_tokens.weight", "lm_head.weight", "model.layers.0.mlp.router.weight",
                 "model.layers.0.input_layernorm.weight"):
        assert rule_for(name, cfg, r1) is None
    # more kv heads' readers than kv heads: rank r reads head r // 2 of 8, all of it
    r5 = ShardLayout.of(ModelConfig(num_attention_heads=64, num_key_value_heads=8), 5, 16, False)
    assert rule_for("model.layers.0.self_attn.v_proj.weight", cfg, r5) == Cut(0, 128, 192, 64)
    padded = cut_tensor(torch.ones(2, 6, 3, dtype=torch.uint8), Cut(1, 2, 4, 5))
    assert padded.shape == (2, 5, 3) and padded[:, :2].all() and not padded[:, 2:].any()


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("ep", [False, True])
@pytest.mark.parametrize("mode", ["uniform", "sparse"])
def test_shares_of_a_moe_layer_add_up_to_the_layer(n: int, ep: bool, mode: str) -> None:
    """What every rank computes (its columns of every expert, padded; or its experts, the others'
    slots at weight 0) summed over the ranks is the whole MoE's output (float32, on the CPU)."""
    torch.manual_seed(0)
    cfg = ModelConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=1, num_attention_heads=8,
                      num_key_value_heads=2, head_dim=16, num_local_experts=8, num_experts_per_tok=4)
    experts = random_experts(8, 64, 160)
    x = torch.randn(37, 64)
    weights, ids = random_routing(37, 8, 4, mode)
    whole = moe_reference(x, weights, ids, experts, 7.0)
    total = torch.zeros_like(whole)
    for layout in layouts(cfg, n, ep):
        shard = expert_shard(experts, cfg, layout)
        w, i = own_share(weights, ids, layout.experts) if ep else (weights, ids)
        assert int(i.min()) >= 0 and int(i.max()) < len(layout.experts)
        total += moe_reference(x, w, i, shard, 7.0)
    # float32 sums in another order: equal to a few ulps of the layer's scale
    torch.testing.assert_close(total, whole, rtol=1e-5, atol=1e-6 * whole.abs().max().item())


@pytest.mark.parametrize("n,ep,rank", [(2, False, 1), (4, False, 3), (4, True, 2)])
def test_a_rank_loads_its_share_of_the_checkpoint(tiny_checkpoint: Path, n: int, ep: bool, rank: int) -> None:
    """The loader reads a rank's slices from the safetensors files; --load-format dummy cuts the
    full random tensors: the same weights (the checkpoint was written from the same seed)."""
    cfg = preset("tiny")
    layout = ShardLayout.of(cfg, rank, n, ep)
    loaded = build_model(cfg, "cpu", torch.float32, layout)
    load_weights(loaded, tiny_checkpoint, show_progress=False)
    dummy = build_model(cfg, "cpu", torch.float32, layout)
    fill_random_weights(dummy, cfg, seed=0)
    assert loaded.model.layers[0].self_attn.q_proj.weight.shape == (cfg.q_size // n, cfg.hidden_size)
    assert not loaded.model.layers[0].self_attn.o_proj.bias.any()  # rank > 0: added once, by rank 0
    for (name, a), b in zip(loaded.state_dict().items(), dummy.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_too_few_gpus_and_a_busy_port_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ConfigError, match="--tensor-parallel-size 4 needs 4 GPUs from cuda:0; 2 are visible"):
        rank_devices(torch.device("cuda"), ParallelConfig(size=4))
    assert rank_devices(torch.device("cuda"), ParallelConfig(size=2)) == [torch.device("cuda", r) for r in (0, 1)]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError, match=f"--nccl-port {port}: cannot listen on 127.0.0.1:{port}"):
            rendezvous_store(port, 2)
