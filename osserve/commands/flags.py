"""The flags of `osserve serve | generate | bench latency`, in argument groups (model, engine, server,
tools), under the names vLLM and SGLang users type: a recipe's command line runs as written. Each
flag either means what it means there, or is refused at start with a message that says what osserve
does instead (osserve/unsupported.py); one that means nothing here because osserve always does it
(--trust-remote-code, --enable-auto-tool-choice, --reasoning-parser gpt-oss) is accepted with a
note saying so. Nothing is dropped without a word.

Also vLLM's habits: `--config FILE.yaml` (its keys are flags; the command line wins), underscores
for dashes (`--tensor_parallel_size 8`), and `-O...` / `-cc.X=Y` compilation settings (refused).

Only argparse and plain Python here: `osserve --help` must not import torch."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from osserve.config import PRESETS
from osserve.errors import ConfigError
from osserve.unsupported import HARMONY_PARSERS, TRITON, refuse_unsupported

MODEL_HELP = ("a checkpoint folder, or a Hugging Face id ORG/NAME[@REVISION] (e.g. openai/gpt-oss-20b), taken "
              "from the local Hugging Face cache or downloaded (config, safetensors, index, generation config); "
              "default: the built-in demo model")


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("model_tag", nargs="?", default=None, metavar="MODEL", help=MODEL_HELP)
    g.add_argument("--model", "--model-path", dest="model", default=None, metavar="MODEL",
                   help="the same as MODEL (--model-path: SGLang's name)")
    g.add_argument("--revision", default=None, metavar="REV",
                   help="a Hub branch, tag or commit of a Hugging Face id (the same as MODEL@REVISION)")
    g.add_argument("--download-dir", default=None, metavar="DIR",
                   help="the Hugging Face cache to look in and download to (default: HF_HUB_CACHE, HF_HOME/hub)")
    g.add_argument("--load-format", choices=("auto", "dummy"), default="auto",
                   help="dummy: random weights of --preset's shapes, made on the device (no disk)")
    g.add_argument("--preset", choices=PRESETS, default=None, help="shapes for --load-format dummy")
    g.add_argument("--dtype", choices=("auto", "bfloat16", "float32"), default="auto")
    g.add_argument("--trust-remote-code", action="store_true",
                   help="accepted: osserve runs no code from a checkpoint, so there is nothing to trust")


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Model and engine flags shared by serve, generate and bench latency."""
    add_model_args(p)
    g = p.add_argument_group("engine")
    g.add_argument("--device", default=None, metavar="DEVICE", help="cuda or cpu (default: cuda when available)")
    g.add_argument("--max-model-len", "--context-length", dest="max_model_len", type=int, metavar="N", default=None,
                   help="prompt + output tokens of one request (--context-length: SGLang's name)")
    g.add_argument("--max-num-seqs", "--max-running-requests", dest="max_num_seqs", type=int, metavar="N", default=None,
                   help="requests in one batch")
    g.add_argument("--max-num-batched-tokens", "--chunked-prefill-size", dest="max_num_batched_tokens", type=int,
                   metavar="N", default=None,
                   help="tokens in one step (prompt chunks + decodes; --chunked-prefill-size: SGLang's name); long "
                        "prompts are chunked to fit (default: "
                        "16384 on a GPU where its 2 GiB more workspace costs at most a tenth of the KV cache, as "
                        "for the 20b on an 80 GB card; else 8192)")
    g.add_argument("--decode-first-chunk", type=int, metavar="N", default=None,
                   help="decode-first scheduling: while --decode-first-min-decodes or more requests decode, a "
                        "step takes at most N prompt tokens, so their next tokens are not held up behind a long "
                        "prefill (default 2048; 0: off). The nearest peers are vLLM's "
                        "--long-prefill-token-threshold and SGLang's --chunked-prefill-size, which cap prompt "
                        "tokens whatever is decoding")
    g.add_argument("--decode-first-min-decodes", type=int, metavar="M", default=None,
                   help="the decoding requests from which --decode-first-chunk applies (default: three "
                        "quarters of --max-num-seqs, at most 3/256 of --max-num-batched-tokens: 192 at 16384, 96 "
                        "at 8192); with fewer, prompts take whatever of the step "
                        "the decodes leave")
    g.add_argument("--no-decode-first", action="store_true",
                   help="no decode-first rule: prompts and decodes share --max-num-batched-tokens in arrival "
                        "order (the same as --decode-first-chunk 0)")
    g.add_argument("--long-prefill-token-threshold", type=int, metavar="N", default=None,
                   help="refused: vLLM's cap on each prompt's tokens a step; osserve's is --decode-first-chunk")
    g.add_argument("--enable-mixed-chunk", action="store_true",
                   help="accepted: osserve always runs decodes beside prompt chunks in one step")
    g.add_argument("--enable-chunked-prefill", action="store_true",
                   help="accepted: osserve always chunks prompts to --max-num-batched-tokens")
    g.add_argument("--gpu-memory-utilization", "--mem-fraction-static", dest="gpu_memory_utilization",
                   type=float, metavar="X", default=0.90,
                   help="fraction of the GPU's memory for weights + KV cache + graphs (--mem-fraction-static: "
                        "SGLang's name)")
    g.add_argument("--kv-cache-gb", type=float, metavar="X", default=None, help="KV-cache budget (CPU)")
    g.add_argument("--kv-cache-dtype", default="auto", metavar="DTYPE",
                   help="auto: the model's dtype (bf16 on a GPU); fp8 (or fp8_e4m3): e4m3 with a scale per token "
                        "and kv head, 1.94x the tokens of bf16 in the same memory")
    g.add_argument("--block-size", type=int, metavar="N", default=16)
    g.add_argument("--no-prefix-caching", "--no-enable-prefix-caching", "--disable-radix-cache",
                   dest="no_prefix_caching", action="store_true",
                   help="no prefix cache (--disable-radix-cache: SGLang's name)")
    g.add_argument("--enable-prefix-caching", dest="no_prefix_caching", action="store_false",
                   help="the prefix cache (the default)")
    g.add_argument("--enforce-eager", "--disable-cuda-graph", dest="enforce_eager", action="store_true",
                   help="no CUDA graphs")
    g.add_argument("--max-cudagraph-capture-size", "--cuda-graph-max-bs", dest="max_cudagraph_capture_size",
                   type=int, metavar="N", default=None, help="the largest batch captured as a CUDA graph (default: "
                                                "--max-num-seqs); larger batches run eagerly")
    g.add_argument("--no-mixed-graphs", action="store_true",
                   help="no CUDA graphs for steps that mix new prompts with decodes (they run eagerly)")
    g.add_argument("--portable-kernels", action="store_true",
                   help="the portable Triton kernels on any GPU, not the Hopper ones (Gluon MoE and FP8 decode, "
                        "programmatic dependent launch, sm_90 PTX); the default on GPUs other than sm_90 (also: "
                        "OSSERVE_PORTABLE_KERNELS=1)")
    # Both flags name the default: argparse takes a dest's default from the first flag added, and a
    # store_false alone would default to True (every step finished before the next, 97ed7de..).
    g.add_argument("--async-scheduling", dest="no_async_scheduling", action="store_false", default=False,
                   help="schedule step N+1 while step N runs on the GPU (the default)")
    g.add_argument("--no-async-scheduling", "--disable-overlap-schedule", dest="no_async_scheduling",
                   action="store_true", default=False, help="finish each step before scheduling the next")
    g.add_argument("--no-async-prefill", action="store_true",
                   help="a step with prompt tokens (a new prompt, a prompt chunk) first finishes the step in "
                        "flight instead of being launched beside it (async scheduling's steps with a prefill)")
    g.add_argument("--admission-delay-ms", type=float, metavar="X", default=0.0,
                   help="while requests decode, let newcomers gather this long (or 32 of them) before a "
                        "prefill joins the batch: more decode-only (CUDA-graph) steps, a little more TTFT")
    g.add_argument("--seed", type=int, metavar="N", default=0)
    g = p.add_argument_group("engine: parallelism")
    g.add_argument("--tensor-parallel-size", "-tp", "--tp", "--tp-size", dest="tensor_parallel_size",
                   type=int, metavar="N", default=1,
                   help="GPUs of this host the model is split over (1, 2, 4 or 8): attention by heads, each "
                        "expert by its columns; one process a GPU")
    g.add_argument("--enable-expert-parallel", action="store_true",
                   help="with --tensor-parallel-size N: split the experts over the GPUs (E/N whole experts "
                        "each) instead of each expert's columns")
    g.add_argument("--nccl-port", type=int, metavar="N", default=None,
                   help="the GPUs' rendezvous port on 127.0.0.1 (default: a free one)")
    g = p.add_argument_group("engine: speculative decoding")
    g.add_argument("--speculative-config", default=None, metavar="JSON",
                   help='speculative decoding, vLLM\'s JSON: {"method": "eagle3", "model": DRAFT, '
                        '"num_speculative_tokens": 3, "topk": 1, "num_draft_tokens": 4} or {"method": "ngram", '
                        '"num_speculative_tokens": 3, "prompt_lookup_max": 5}; "disable_by_batch_size": N turns it '
                        'off above N running requests (default 32); with the built-in model {"method": "eagle3"} '
                        'uses its shipped draft')
    g.add_argument("--speculative-algorithm", "--speculative-algo", dest="speculative_algorithm", default=None,
                   metavar="NAME", help="SGLang's: EAGLE3 or NGRAM (the same as --speculative-config's method)")
    g.add_argument("--speculative-draft-model-path", "--speculative-draft", dest="speculative_draft_model_path",
                   default=None, metavar="MODEL", help="SGLang's: the EAGLE3 draft (speculative-config's model)")
    g.add_argument("--speculative-num-steps", type=int, metavar="N", default=None,
                   help="SGLang's: draft steps (num_speculative_tokens)")
    g.add_argument("--speculative-eagle-topk", type=int, metavar="N", default=None,
                   help="SGLang's: branches per draft step (topk; 1: a chain)")
    g.add_argument("--speculative-num-draft-tokens", type=int, metavar="N", default=None,
                   help="SGLang's: tokens verified per request per step (num_draft_tokens)")
    g = p.add_argument_group("engine: backends, other parallelism (refused with a reason)")
    g.add_argument("--pipeline-parallel-size", "-pp", dest="pipeline_parallel_size", type=int, metavar="N", default=1)
    g.add_argument("--data-parallel-size", "-dp", "--dp", "--dp-size", dest="data_parallel_size", type=int,
                   metavar="N", default=1)
    g.add_argument("--enable-dp-attention", action="store_true")
    g.add_argument("--attention-backend", default=None, metavar="NAME", help="triton (osserve's own kernels)")
    g.add_argument("--moe-runner-backend", default=None, metavar="NAME", help="triton (osserve's own kernels)")
    g.add_argument("--enforce-disable-flashinfer-allreduce-fusion", action="store_true",
                   help="accepted: osserve uses no FlashInfer all-reduce")
    g.add_argument("--compilation-config", "-O", dest="compilation_config", action="append", metavar="JSON",
                   help="refused: osserve uses no torch.compile")


def add_server_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("server")
    g.add_argument("--config", default=None, metavar="FILE.yaml",
                   help="flags from a YAML file, as vLLM's --config (the command line's own win)")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, metavar="N", default=8000)
    g.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                   help="the name clients send as `model` (default: the Hugging Face id, or the folder's name)")
    g.add_argument("--api-key", default=None, metavar="KEY")
    g.add_argument("--max-waiting", type=int, metavar="N", default=None, help="queue bound; beyond it 503")
    g.add_argument("--stream-interval", type=int, metavar="N", default=1,
                   help="streamed responses carry this many tokens a chunk (the first comes at once)")
    g.add_argument("--disable-log-requests", "--disable-log-request", dest="disable_log_requests",
                   action="store_true", help="no access-log line per request")
    g.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=None,
                   help="run the engine's step loop in a process of its own, sharing no GIL with the HTTP "
                        "server (default: yes on a GPU, no on a CPU)")
    g.add_argument("--api-server-count", type=int, metavar="N", default=None,
                   help="HTTP server processes in front of the one engine process, sharing the port "
                        "(default: 2 with the engine in a process of its own, else 1)")
    g.add_argument("--showcase", action="store_true",
                   help="once up, send the demo model a question and a tool round trip, and print them")


def add_tools_args(p: argparse.ArgumentParser) -> None:
    from osserve.commands.tools import add_python_tool_args

    g = p.add_argument_group("tools (the Responses API runs them for the model)")
    g.add_argument("--tool-server", default=None, metavar="SERVERS",
                   help="comma-separated: demo (the built-in browser over shipped documents, and python), browser, "
                        "python, and MCP servers (http://host:port/mcp, .../sse, or host:port); each is started "
                        "and checked at start")
    g.add_argument("--allow-tool-server-url", dest="allow_tool_server_url", nargs="+", action="extend", default=[],
                   metavar="URL", help="MCP server URLs a request may name as `server_url` (exactly these; any "
                                       "other is refused without a connection)")
    g.add_argument("--tool-call-timeout", type=float, default=60.0, metavar="S",
                   help="one MCP or browser call at most, in seconds (python has --python-tool-timeout)")
    g.add_argument("--browser-backend", choices=("offline", "exa"), default="offline",
                   help="the browser's search: offline (documents, no network) or exa (EXA_API_KEY)")
    g.add_argument("--browser-documents", default=None, metavar="DIR",
                   help="the offline browser's documents (.md, .txt, .html; default: the shipped demo documents)")
    add_python_tool_args(g)
    g.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="accepted: the model always chooses its tools (tool_choice auto)")
    g.add_argument("--tool-call-parser", default=None, metavar="NAME",
                   help="accepted as openai / gpt-oss: tool calls are always read from harmony")
    g.add_argument("--reasoning-parser", default=None, metavar="NAME",
                   help="accepted as gpt-oss / openai_gptoss: reasoning is always read from harmony")


def prepare_argv(argv: Sequence[str]) -> list[str]:
    """vLLM's command-line habits, turned into flags this parser knows."""
    out: list[str] = []
    for i, token in enumerate(argv):
        if token == "--":
            return out + list(argv[i:])
        if token.startswith(("-O", "-cc.")) and token != "-O":
            token = "--compilation-config=" + token  # vLLM's -O3, -O.x=y, -cc.x=y: refused by name
        elif token.startswith("--"):
            name, eq, value = token.partition("=")
            token = name.replace("_", "-") + eq + value
        out.append(token)
    return _expand_config_file(out)


def _expand_config_file(argv: list[str]) -> list[str]:
    """`serve --config FILE.yaml`: the file's keys become flags placed before the command line's own,
    so those win (vLLM's rule). `key: true` is `--key`, `key: false` nothing, a list several values."""
    if not argv or argv[0] != "serve":
        return argv
    for i, token in enumerate(argv):
        if token == "--config" and i + 1 < len(argv):
            path, rest = argv[i + 1], argv[:i] + argv[i + 2:]
        elif token.startswith("--config="):
            path, rest = token.partition("=")[2], argv[:i] + argv[i + 1:]
        else:
            continue
        return rest[:1] + config_file_flags(Path(path)) + rest[1:]
    return argv


def config_file_flags(path: Path) -> list[str]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ConfigError(f"--config {path}: {e.strerror}", "config") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"--config {path}: not valid YAML ({e})", "config") from e
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected a mapping of flag names to values", "config")
    flags: list[str] = []
    for key, value in data.items():
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            flags.append(flag)
        elif isinstance(value, list):
            flags += [flag, *map(str, value)]
        elif value is not False and value is not None:
            flags.append(f"{flag}={value}")
    return flags


def settle(args: argparse.Namespace) -> list[str]:
    """After parsing: one model, one served name, the refusals (ConfigError); returns the notes to
    print for flags accepted because osserve always does what they ask."""
    tag = getattr(args, "model_tag", None)
    if tag is not None:
        if args.model is not None and args.model != tag:
            raise ConfigError(f"two models: {tag} and --model {args.model}", "model")
        args.model = tag
    refuse_unsupported(args)
    check_speculative(args)
    names = getattr(args, "served_model_name", None)
    if isinstance(names, list):
        args.served_model_name = names[0]
    if getattr(args, "stream_interval", 1) < 1:
        raise ConfigError("--stream-interval must be at least 1", "stream_interval")
    return _notes(args)


def check_speculative(args: argparse.Namespace) -> None:
    """--speculative-config's JSON, or SGLang's flags, checked at start (a bad key stops it here)."""
    if hasattr(args, "speculative_config"):
        from osserve.speculative.config import resolve_speculative

        resolve_speculative(args)


def _notes(args: argparse.Namespace) -> list[str]:
    notes = []
    if getattr(args, "trust_remote_code", False):
        notes.append("--trust-remote-code: osserve runs no code from a checkpoint; nothing to trust")
    if getattr(args, "enable_auto_tool_choice", False):
        notes.append("--enable-auto-tool-choice: osserve always lets the model choose its tools (tool_choice auto)")
    for flag in ("reasoning_parser", "tool_call_parser"):
        if getattr(args, flag, None) in HARMONY_PARSERS:
            notes.append(f"--{flag.replace('_', '-')} {getattr(args, flag)}: osserve always parses gpt-oss's "
                         "harmony output into reasoning, content and tool calls")
    if getattr(args, "enable_chunked_prefill", False):
        notes.append("--enable-chunked-prefill: osserve always chunks prompts to --max-num-batched-tokens")
    if getattr(args, "enable_mixed_chunk", False):
        notes.append("--enable-mixed-chunk: osserve always runs decodes beside prompt chunks in one step")
    if getattr(args, "attention_backend", None) in TRITON:
        notes.append(f"--attention-backend {args.attention_backend}: osserve's attention is its own Triton kernels")
    if getattr(args, "moe_runner_backend", None) in ("auto", "triton"):
        notes.append(f"--moe-runner-backend {args.moe_runner_backend}: osserve's MoE is its own Triton kernels")
    if getattr(args, "enforce_disable_flashinfer_allreduce_fusion", False):
        notes.append("--enforce-disable-flashinfer-allreduce-fusion: osserve uses no FlashInfer all-reduce")
    return notes
