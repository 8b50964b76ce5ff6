"""The vLLM and SGLang gpt-oss recipes' command lines, written as the recipes give them, through
osserve's parser: each flag lands in the setting it means there, or the line is refused with a
message that says what osserve does instead (osserve/unsupported.py). Sources: the vLLM recipe
(vllm-project/recipes OpenAI/GPT-OSS.md, its GPT-OSS_*.yaml configs, and its earlier versions),
SGLang's gpt-oss guide (sgl-project/sglang issue 8833, docs/basic_usage/gpt_oss.md, the cookbook's
GPT-OSS page and its command generator)."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from osserve import __version__, cli
from osserve.commands.flags import prepare_argv, settle
from osserve.engine.load import EngineArgs, build_engine
from osserve.errors import ConfigError
from osserve.unsupported import refusals

LAUNCHERS = ("vllm serve", "python3 -m sglang.launch_server", "python -m sglang.launch_server")


def parse(line: str) -> argparse.Namespace:
    """A recipe's command line as `osserve serve` reads it (the launcher replaced by `serve`)."""
    for launcher in LAUNCHERS:
        if line.startswith(launcher):
            line = "serve" + line[len(launcher):]
    return cli.build_parser().parse_args(prepare_argv(shlex.split(line)))


def settled(line: str) -> argparse.Namespace:
    args = parse(line)
    settle(args)
    return args


def refused(line: str) -> list[str]:
    return refusals(parse(line))


def has(args: argparse.Namespace, **expected: Any) -> bool:
    got = {k: getattr(args, k) for k in expected}
    assert got == expected
    return True


# ---------------------------------------------------------------------------------------- vLLM
ACCEPTED_VLLM = [
    # async scheduling is on unless a flag turns it off (a store_false flag once made it off by default)
    ("vllm serve openai/gpt-oss-20b", dict(model="openai/gpt-oss-20b", tensor_parallel_size=1,
                                           no_async_scheduling=False)),
    ("vllm serve openai/gpt-oss-120b", dict(model="openai/gpt-oss-120b")),
    ("vllm serve openai/gpt-oss-20b --async-scheduling", dict(model="openai/gpt-oss-20b", no_async_scheduling=False)),
    ("vllm serve openai/gpt-oss-120b --gpu-memory-utilization 0.95 --max-num-batched-tokens 1024",
     dict(gpu_memory_utilization=0.95, max_num_batched_tokens=1024)),
    # the recipe's docker line: `vllm/vllm-openai --model openai/gpt-oss-20b`
    ("vllm serve --model openai/gpt-oss-20b", dict(model="openai/gpt-oss-20b")),
    ("vllm serve ... --tool-call-parser openai --enable-auto-tool-choice",
     dict(model="...", tool_call_parser="openai", enable_auto_tool_choice=True)),
    ("vllm serve openai/gpt-oss-120b --tensor-parallel-size 1 --host 0.0.0.0 --port 8000",
     dict(tensor_parallel_size=1, host="0.0.0.0", port=8000)),
    # the evaluation deployment, on one GPU (the recipe's has --tensor_parallel_size 8: refused below)
    ("vllm serve openai/gpt-oss-120b --tensor_parallel_size 1 --max-model-len 131072 --max-num-batched-tokens 10240 "
     "--max-num-seqs 128 --gpu-memory-utilization 0.85 --no-enable-prefix-caching",
     dict(max_model_len=131072, max_num_batched_tokens=10240, max_num_seqs=128, gpu_memory_utilization=0.85,
          no_prefix_caching=True)),
    ("vllm serve ... --tool-server demo", dict(tool_server="demo")),
    ("vllm serve ... --tool-server ip-1:port-1,ip-2:port-2", dict(tool_server="ip-1:port-1,ip-2:port-2")),
    ("vllm serve /path/to/gpt-oss-20b --host 192.168.31.103 --port 8000 --served-model-name openai/gpt-oss-20b "
     "--tensor-parallel-size 1 --gpu-memory-utilization 0.9 --max-model-len 26384 --async-scheduling",
     dict(model="/path/to/gpt-oss-20b", served_model_name="openai/gpt-oss-20b", max_model_len=26384)),
    ("vllm serve openai/gpt-oss-120b --tensor-parallel-size 2", dict(tensor_parallel_size=2)),
    ("vllm serve openai/gpt-oss-120b --tensor-parallel-size 4", dict(tensor_parallel_size=4)),
    ("vllm serve openai/gpt-oss-120b --tensor-parallel-size 2 --async-scheduling",
     dict(tensor_parallel_size=2, no_async_scheduling=False)),
    ("vllm serve openai/gpt-oss-120b --tensor_parallel_size 8 --max-model-len 131072 --max-num-batched-tokens 10240 "
     "--max-num-seqs 128 --gpu-memory-utilization 0.85 --no-enable-prefix-caching",
     dict(tensor_parallel_size=8, max_model_len=131072, max_num_seqs=128, no_prefix_caching=True)),
    ("vllm serve openai/gpt-oss-120b --tensor-parallel-size 4 --enable-expert-parallel",
     dict(tensor_parallel_size=4, enable_expert_parallel=True)),
]

REFUSED_VLLM = [
    ("vllm serve openai/gpt-oss-120b --compilation-config '{\"full_cuda_graph\": true}'",
     "osserve uses no torch.compile"),
    ("vllm serve openai/gpt-oss-120b --compilation-config '{\"compile_sizes\": [1, 2, 4, 8, 16, 24, 32, 64, 128, "
     "256, 4096, 8192], \"full_cuda_graph\": true}' --block-size 64", "osserve uses no torch.compile"),
    ("vllm serve openai/gpt-oss-120b --tensor-parallel-size=8 --gpu-memory-utilization 0.95 --compilation-config "
     "'{\"cudagraph_mode\": \"FULL_AND_PIECEWISE\"}' --block-size=64 --disable-log-request --async-scheduling",
     "osserve uses no torch.compile"),
    ("vllm serve openai/gpt-oss-120b --tensor-parallel-size=8 --attention-backend ROCM_AITER_UNIFIED_ATTN "
     "-cc.pass_config.fuse_rope_kvcache=True -cc.use_inductor_graph_partition=True --gpu-memory-utilization 0.95 "
     "--block-size=64", "--attention-backend ROCM_AITER_UNIFIED_ATTN: osserve has one attention"),
]


@pytest.mark.parametrize("line,expected", ACCEPTED_VLLM + [], ids=[x[0][:60] for x in ACCEPTED_VLLM])
def test_vllm_recipe_lines_parse(line: str, expected: dict[str, Any]) -> None:
    assert has(settled(line), **expected)


@pytest.mark.parametrize("line,reason", REFUSED_VLLM, ids=[x[0][:60] for x in REFUSED_VLLM])
def test_vllm_recipe_lines_refused_with_a_reason(line: str, reason: str) -> None:
    found = refused(line)
    assert any(reason in r for r in found), found
    with pytest.raises(ConfigError):
        settle(parse(line))


def test_amd_line_refuses_each_flag_it_cannot_honour() -> None:
    found = refused(REFUSED_VLLM[-1][0])
    assert len(found) == 2
    assert "--attention-backend" in found[1] and "-cc.pass_config.fuse_rope_kvcache=True" in found[0]
    assert has(parse(REFUSED_VLLM[-1][0]), tensor_parallel_size=8)


HOPPER_YAML = """\
no-enable-prefix-caching: true
max-cudagraph-capture-size: 2048
max-num-batched-tokens: 8192
stream-interval: 20
"""
BLACKWELL_YAML = "kv-cache-dtype: fp8\n" + HOPPER_YAML
EAGLE3_HOPPER_YAML = HOPPER_YAML + """speculative-config: '{"model":"nvidia/gpt-oss-120b-Eagle3-v2",\
"num_speculative_tokens":3,"method":"eagle3","draft_tensor_parallel_size":1}'
"""


def test_recipe_config_files(tmp_path: Path) -> None:
    """`vllm serve openai/gpt-oss-120b --config ${YAML_CONFIG} --tensor-parallel-size 1`, with the recipe's files."""
    for name, text in [("GPT-OSS_Hopper.yaml", HOPPER_YAML), ("GPT-OSS_Blackwell.yaml", BLACKWELL_YAML),
                       ("GPT-OSS_EAGLE3_Hopper.yaml", EAGLE3_HOPPER_YAML)]:
        (tmp_path / name).write_text(text)
    line = f"vllm serve openai/gpt-oss-120b --config {tmp_path}/%s --tensor-parallel-size 1"
    assert has(settled(line % "GPT-OSS_Hopper.yaml"), model="openai/gpt-oss-120b", no_prefix_caching=True,
               max_cudagraph_capture_size=2048, max_num_batched_tokens=8192, stream_interval=20)
    assert refused(line % "GPT-OSS_Blackwell.yaml") == []  # --kv-cache-dtype fp8: e4m3 with scales
    assert has(settled(line % "GPT-OSS_Blackwell.yaml"), kv_cache_dtype="fp8", no_prefix_caching=True,
               max_num_batched_tokens=8192)
    eagle = settled(line % "GPT-OSS_EAGLE3_Hopper.yaml")
    assert json.loads(eagle.speculative_config) == {"model": "nvidia/gpt-oss-120b-Eagle3-v2",
                                                     "num_speculative_tokens": 3, "method": "eagle3",
                                                     "draft_tensor_parallel_size": 1}
    # the command line wins over the file
    assert has(settled(line % "GPT-OSS_Hopper.yaml" + " --max-num-batched-tokens 1024"), max_num_batched_tokens=1024)
    (tmp_path / "bad.yaml").write_text("- a list\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        parse(line % "bad.yaml")


# -------------------------------------------------------------------------------------- SGLang
ACCEPTED_SGLANG = [
    ("python3 -m sglang.launch_server --model-path openai/gpt-oss-20b", dict(model="openai/gpt-oss-20b")),
    ("python -m sglang.launch_server --model openai/gpt-oss-120b --reasoning-parser gpt-oss",
     dict(reasoning_parser="gpt-oss")),
    ("python -m sglang.launch_server --model openai/gpt-oss-120b --reasoning-parser gpt-oss "
     "--tool-call-parser gpt-oss", dict(reasoning_parser="gpt-oss", tool_call_parser="gpt-oss")),
    ("python -m sglang.launch_server --model openai/gpt-oss-20b --device cpu --disable-overlap-schedule",
     dict(device="cpu", no_async_scheduling=True)),
    ("python -m sglang.launch_server --model openai/gpt-oss-20b --attention-backend triton "
     "--moe-runner-backend triton --enforce-disable-flashinfer-allreduce-fusion",
     dict(attention_backend="triton", moe_runner_backend="triton")),
    # the SGLang gpt-oss post's speculative decoding, chain and tree (on one GPU)
    ("python3 -m sglang.launch_server --model openai/gpt-oss-120b --speculative-algorithm EAGLE3 "
     "--speculative-draft-model-path lmsys/EAGLE3-gpt-oss-120b-bf16 --speculative-num-steps 3 "
     "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4",
     dict(speculative_algorithm="EAGLE3", speculative_draft_model_path="lmsys/EAGLE3-gpt-oss-120b-bf16",
          speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4)),
    ("python3 -m sglang.launch_server --model openai/gpt-oss-120b --speculative-algo EAGLE3 --speculative-draft "
     "lmsys/EAGLE3-gpt-oss-120b-bf16 --speculative-num-steps 5 --speculative-eagle-topk 4 "
     "--speculative-num-draft-tokens 8 --attention-backend triton",
     dict(speculative_algorithm="EAGLE3", speculative_num_steps=5, speculative_eagle_topk=4,
          speculative_num_draft_tokens=8)),
    ("python3 -m sglang.launch_server --model-path openai/gpt-oss-120b --tp 1 --mem-fraction-static 0.85 "
     "--context-length 32768 --max-running-requests 64 --disable-radix-cache --disable-cuda-graph",
     dict(tensor_parallel_size=1, gpu_memory_utilization=0.85, max_model_len=32768, max_num_seqs=64,
          no_prefix_caching=True, enforce_eager=True)),
    ("python3 -m sglang.launch_server --model-path openai/gpt-oss-120b --tp 4", dict(tensor_parallel_size=4)),
    ("python3 -m sglang.launch_server --model openai/gpt-oss-120b --tp 8 --attention-backend triton",
     dict(tensor_parallel_size=8, attention_backend="triton")),
    ("python3 -m sglang.launch_server --model openai/gpt-oss-120b --tp 2 --nccl-port 29600",
     dict(tensor_parallel_size=2, nccl_port=29600)),
]

REFUSED_SGLANG = [
    ("python -m sglang.launch_server --model openai/gpt-oss-120b --tp 8 --enable-dp-attention --dp 8",
     "--enable-dp-attention is not supported yet"),
    ("python -m sglang.launch_server --model openai/gpt-oss-120b --tool-call-parser hermes",
     "--tool-call-parser hermes: osserve serves gpt-oss and always reads its tool calls from harmony"),
]


@pytest.mark.parametrize("line,expected", ACCEPTED_SGLANG, ids=[x[0][31:91] for x in ACCEPTED_SGLANG])
def test_sglang_lines_parse(line: str, expected: dict[str, Any]) -> None:
    assert has(settled(line), **expected)


@pytest.mark.parametrize("line,reason", REFUSED_SGLANG, ids=[x[0][31:91] for x in REFUSED_SGLANG])
def test_sglang_lines_refused_with_a_reason(line: str, reason: str) -> None:
    found = refused(line)
    assert any(reason in r for r in found), found


@pytest.mark.parametrize("line", [
    "python3 -m sglang.launch_server --model-path openai/gpt-oss-120b --tool-server demo --tp 2",
    "python -m sglang.launch_server --model-path openai/gpt-oss-120b --tool-server ip-1:port-1,ip-2:port-2 --tp 2"])
def test_sglang_tool_server_lines_parse(line: str) -> None:
    args = parse(line)
    assert args.tool_server == line.split("--tool-server ")[1].split()[0]
    assert not [r for r in refusals(args) if "--tool-server" in r]


def test_tool_flags_become_the_registrys_options() -> None:
    from osserve.commands.tools import tool_server_options

    args = settled("vllm serve x --tool-server demo,http://127.0.0.1:9/mcp --allow-tool-server-url http://a/mcp "
                   "http://b/sse --python-tool-timeout 5 --tool-call-timeout 7 --browser-documents /docs")
    options = tool_server_options(args)
    assert args.tool_server == "demo,http://127.0.0.1:9/mcp"
    assert options.allowed_server_urls == ("http://a/mcp", "http://b/sse")
    assert options.python_limits.wall_seconds == 5 and options.mcp_call_timeout == options.browser_call_timeout == 7
    assert str(options.browser_documents) == "/docs" and options.browser == "offline"


def test_flags_osserve_always_honours_are_noted() -> None:
    notes = settle(parse("vllm serve ... --tool-call-parser openai --enable-auto-tool-choice --trust-remote-code"))
    assert any("tool_choice auto" in n for n in notes) and any("harmony" in n for n in notes)
    assert any("runs no code from a checkpoint" in n for n in notes)
    assert settle(parse("vllm serve openai/gpt-oss-20b")) == []


def test_model_name_and_its_conflicts() -> None:
    with pytest.raises(ConfigError, match="two models"):
        settled("vllm serve openai/gpt-oss-20b --model openai/gpt-oss-120b")
    assert settled("vllm serve openai/gpt-oss-20b --model openai/gpt-oss-20b").model == "openai/gpt-oss-20b"
    assert refused("vllm serve x --served-model-name a b") == [
        "--served-model-name a b: osserve serves one model under one name; give one"]
    assert settled("vllm serve x --served-model-name gpt-oss:20b").served_model_name == "gpt-oss:20b"


def test_generate_and_bench_take_a_model_id_too() -> None:
    assert settled("generate openai/gpt-oss-20b --prompt hi").model == "openai/gpt-oss-20b"
    assert settled("bench latency --model openai/gpt-oss-20b --batch-size 2").model == "openai/gpt-oss-20b"


def test_a_refusal_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "openai/gpt-oss-120b", "--kv-cache-dtype", "fp8_e5m2"]) == 1
    err = capsys.readouterr().err
    assert err == ("osserve: error: --kv-cache-dtype fp8_e5m2: osserve's FP8 KV cache is e4m3 with a scale per token "
                   "and kv head, a mantissa bit more precise than e5m2 and never out of range: pass --kv-cache-dtype "
                   "fp8 (or fp8_e4m3)\n")


def test_the_offline_llm_refuses_through_the_same_table() -> None:
    with pytest.raises(ConfigError, match="--tensor-parallel-size 3 must divide the model's 8 attention heads"):
        build_engine(EngineArgs(load_format="dummy", preset="tiny", device="cpu", tensor_parallel_size=3))
    with pytest.raises(ConfigError, match="--kv-cache-dtype fp8_e5m2: osserve's FP8 KV cache is e4m3"):
        build_engine(EngineArgs(kv_cache_dtype="fp8_e5m2"))
    with pytest.raises(ConfigError, match=r"--kv-cache-dtype fp8_inc: osserve stores the KV cache in the model's "
                                          r"dtype \(auto; bfloat16\) or in FP8 e4m3 with scales \(fp8, fp8_e4m3\)"):
        build_engine(EngineArgs(kv_cache_dtype="fp8_inc"))


def test_version_and_grouped_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert capsys.readouterr().out == f"osserve {__version__}\n"
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    out = capsys.readouterr().out
    heads = [line for line in out.splitlines() if line and not line.startswith(" ") and line.endswith(":")]
    assert heads[1:7] == ["model:", "engine:", "engine: parallelism:", "engine: speculative decoding:",
                          "engine: backends, other parallelism (refused with a reason):", "server:"]
    assert heads[-1] == "tools (the Responses API runs them for the model):"


@pytest.mark.parametrize("command", [["serve"], ["bench", "latency"]])
def test_async_scheduling_is_on_unless_turned_off(command: list[str]) -> None:
    from osserve.cli import build_parser

    parser = build_parser()
    assert parser.parse_args([*command]).no_async_scheduling is False
    assert parser.parse_args([*command, "--async-scheduling"]).no_async_scheduling is False
    assert parser.parse_args([*command, "--no-async-scheduling"]).no_async_scheduling is True


def test_no_async_prefill_reaches_the_scheduler() -> None:
    """--no-async-prefill turns off launching steps with prompt tokens beside a step in flight;
    without it they are (the default)."""
    import torch

    from osserve.cli import build_parser
    from osserve.engine.load import EngineArgs, cache_config, model_source, scheduler_config

    parser = build_parser()
    for extra, expected in (([], True), (["--no-async-prefill"], False)):
        args = EngineArgs.from_namespace(parser.parse_args(["serve", "--preset", "tiny", *extra]))
        cfg, _ = model_source(args)
        sched = scheduler_config(args, cfg, torch.device("cpu"), cache_config(args), torch.bfloat16, 1)
        assert sched.async_prefill is expected and sched.async_scheduling
