"""Recipe flags osserve parses but refuses: the vLLM and SGLang gpt-oss recipes' flags that osserve
cannot honour, each refused at start with a message that says what osserve does instead, never
dropped without a word.

Two kinds. NOT_YET: features being built (data and pipeline parallelism); turning one on is
deleting its entry here and wiring the value where the engine is assembled (engine/load.py) or the
server started (server/run.py).
NEVER: settings of machinery osserve does not have (torch.compile, other attention or MoE
backends, other reasoning/tool-call parsers).

The checks read attributes by name, so they run on the CLI's namespace (`osserve serve`,
`generate`, `bench latency`) and on EngineArgs (the offline `LLM(...)`) alike; an object without
the attribute is not checked for it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from osserve.errors import ConfigError

# What vLLM and SGLang call the one parser osserve has: harmony, through openai-harmony.
HARMONY_PARSERS = ("openai", "gpt-oss", "gpt_oss", "openai_gptoss", "harmony")
TRITON = ("triton", "TRITON_ATTN", "TRITON_ATTN_VLLM_V1")
# --kv-cache-dtype values osserve takes (engine/load.py's resolve_kv_dtype): the model's dtype, or FP8 e4m3
# with a scale per token and kv head (ops/attention/kv_format.py).
KV_CACHE_DTYPES = ("auto", "bfloat16", "bf16", "fp8", "fp8_e4m3")


@dataclass(frozen=True)
class Refusal:
    dest: str  # the argparse dest / EngineArgs field
    refused: Callable[[Any], bool]  # true for the values osserve cannot honour
    message: str  # formatted with {value}


NOT_YET = [
    Refusal("pipeline_parallel_size", lambda v: v not in (None, 1),
            "--pipeline-parallel-size {value} is not supported yet; osserve splits a model over the GPUs of "
            "one host by tensor parallelism (--tensor-parallel-size N)"),
    Refusal("data_parallel_size", lambda v: v not in (None, 1),
            "--data-parallel-size {value} is not supported yet; run {value} osserve servers (one per GPU) "
            "behind a load balancer"),
    Refusal("enable_dp_attention", bool,
            "--enable-dp-attention is not supported yet; osserve splits attention by heads over the "
            "--tensor-parallel-size ranks"),
]

NEVER = [
    Refusal("kv_cache_dtype", lambda v: str(v).lower() == "fp8_e5m2",
            "--kv-cache-dtype {value}: osserve's FP8 KV cache is e4m3 with a scale per token and kv head, a "
            "mantissa bit more precise than e5m2 and never out of range: pass --kv-cache-dtype fp8 (or fp8_e4m3)"),
    Refusal("kv_cache_dtype", lambda v: v is not None and str(v).lower() not in KV_CACHE_DTYPES + ("fp8_e5m2",),
            "--kv-cache-dtype {value}: osserve stores the KV cache in the model's dtype (auto; bfloat16) or in FP8 "
            "e4m3 with scales (fp8, fp8_e4m3)"),
    Refusal("compilation_config", lambda v: v is not None,
            "--compilation-config / -O / -cc ({value}): osserve uses no torch.compile; its decode steps run as "
            "CUDA graphs already (up to --max-cudagraph-capture-size; --enforce-eager turns them off)"),
    Refusal("attention_backend", lambda v: v is not None and v not in TRITON,
            "--attention-backend {value}: osserve has one attention, its own Triton kernels over the paged "
            "cache (sinks, sliding window): --attention-backend triton, or leave it out"),
    Refusal("moe_runner_backend", lambda v: v is not None and v not in ("auto", "triton"),
            "--moe-runner-backend {value}: osserve runs the MXFP4 experts with its own Triton/Gluon kernels: "
            "--moe-runner-backend triton, or leave it out"),
    Refusal("reasoning_parser", lambda v: v is not None and v not in HARMONY_PARSERS,
            "--reasoning-parser {value}: osserve serves gpt-oss and always reads its reasoning from the harmony "
            "`analysis` channel (--reasoning-parser gpt-oss, or leave it out)"),
    Refusal("tool_call_parser", lambda v: v is not None and v not in HARMONY_PARSERS,
            "--tool-call-parser {value}: osserve serves gpt-oss and always reads its tool calls from harmony "
            "(--tool-call-parser openai / gpt-oss, or leave it out)"),
    Refusal("served_model_name", lambda v: isinstance(v, list) and len(v) > 1,
            "--served-model-name {value}: osserve serves one model under one name; give one"),
    Refusal("long_prefill_token_threshold", lambda v: v is not None,
            "--long-prefill-token-threshold {value}: osserve caps a step's prompt tokens only while requests "
            "decode (decode-first): --decode-first-chunk {value} (0: off; --decode-first-min-decodes M: from how "
            "many decoding requests)"),
]


def refusals(settings: object) -> list[str]:
    """Every refusal `settings` (an argparse namespace or EngineArgs) earns, in the tables' order."""
    found = []
    for r in NOT_YET + NEVER:
        value = getattr(settings, r.dest, None)
        if hasattr(settings, r.dest) and r.refused(value):
            found.append(r.message.format(value=" ".join(value) if isinstance(value, list) else value))
    return found


def refuse_unsupported(settings: object) -> None:
    """Raise ConfigError for the first flag osserve cannot honour (see the module's docstring)."""
    found = refusals(settings)
    if found:
        raise ConfigError(found[0])
