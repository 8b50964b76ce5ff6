"""`--speculative-config` (vLLM's flag, `LLM(speculative_config={...})`) and SGLang's flags for it.

Keys (vLLM's names and meanings; `topk` and `num_draft_tokens` are SGLang's `--speculative-eagle-topk`
and `--speculative-num-draft-tokens`):
- method: "eagle3" (a draft model) or "ngram" (prompt lookup, no model).
- model: the EAGLE3 draft, a folder or Hugging Face id; left out with the built-in model, its draft.
- num_speculative_tokens: draft steps a request takes each step (the tree's depth).
- topk: branches per draft step (EAGLE3); 1 is a chain.
- num_draft_tokens: tokens verified per request per step, the last known token included (SGLang's
  count): a chain's is num_speculative_tokens + 1; a tree's at most what its steps can grow.
- prompt_lookup_max / prompt_lookup_min: the n-gram sizes tried, longest first (ngram; 5 / 5 by
  default, as vLLM).
- disable_by_batch_size: no speculation in steps with more running requests than this (vLLM's
  name; default 32, to be confirmed by benchmarks/bench_spec.py on a GPU).
Every other key, and every inconsistent value, stops start-up with a ConfigError naming the key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

from osserve.errors import ConfigError
from osserve.ops.attention.metadata import MAX_TREE_TOKENS

METHODS = ("eagle3", "ngram")
DEFAULT_DISABLE_BY_BATCH_SIZE = 32
MAX_STEPS = 16


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    model: str | None = None
    num_speculative_tokens: int = 3
    topk: int = 1
    num_draft_tokens: int = 4
    prompt_lookup_max: int = 5
    prompt_lookup_min: int = 5
    disable_by_batch_size: int = DEFAULT_DISABLE_BY_BATCH_SIZE

    @property
    def is_tree(self) -> bool:
        return self.topk > 1

    @property
    def max_drafts(self) -> int:
        """Draft tokens one request verifies in a step, at most."""
        return self.num_draft_tokens - 1

    @property
    def draft_rows_per_step(self) -> int:
        """Rows a request's draft runs in each expansion step after the first (EAGLE3)."""
        return self.topk

    @property
    def lookahead_slots(self) -> int:
        """KV slots the draft writes past a step's verified tokens: its expansion rows (EAGLE3).
        The scheduler gives every speculating request blocks for them."""
        return (self.num_speculative_tokens - 1) * self.topk if self.method == "eagle3" else 0


def max_tree_nodes(steps: int, topk: int) -> int:
    """Candidates EAGLE3's beam search grows: topk at depth 1, then topk x topk a step."""
    return topk + (steps - 1) * topk * topk


def parse_speculative_config(value: str | dict[str, Any] | None) -> SpeculativeConfig | None:
    """The flag's JSON (or LLM's dict) as a checked SpeculativeConfig; None when not given."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            raw = json.loads(value)
        except json.JSONDecodeError as e:
            raise ConfigError(f"--speculative-config is not valid JSON: {e}", "speculative_config") from e
    else:
        raw = dict(value)
    if not isinstance(raw, dict):
        raise ConfigError("--speculative-config must be a JSON object", "speculative_config")
    known = {f.name for f in fields(SpeculativeConfig)} | {"draft_tensor_parallel_size"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"--speculative-config: unknown key '{unknown[0]}' (known: {', '.join(sorted(known))})",
                          f"speculative_config.{unknown[0]}")
    return build(raw)


def _int(raw: dict[str, Any], key: str, default: int | None) -> int | None:
    value = raw.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"--speculative-config: '{key}' must be an integer, got {value!r}",
                          f"speculative_config.{key}")
    return value


def build(raw: dict[str, Any]) -> SpeculativeConfig:
    def bad(key: str, why: str) -> ConfigError:
        return ConfigError(f"--speculative-config: '{key}' {why}", f"speculative_config.{key}")

    method = str(raw.get("method") or ("ngram" if raw.get("model") in ("ngram", "[ngram]") else "")).lower()
    method = {"[ngram]": "ngram", "eagle-3": "eagle3"}.get(method, method)
    if method not in METHODS:
        raise bad("method", f"is {raw.get('method')!r}: osserve speculates with {' or '.join(METHODS)}")
    if _int(raw, "draft_tensor_parallel_size", 1) != 1:
        raise bad("draft_tensor_parallel_size", "must be 1: osserve runs the draft on the target's GPU")
    steps = _int(raw, "num_speculative_tokens", 3)
    assert steps is not None
    if not 1 <= steps <= MAX_STEPS:
        raise bad("num_speculative_tokens", f"is {steps}: must be in 1..{MAX_STEPS}")
    topk = _int(raw, "topk", 1)
    assert topk is not None
    if topk < 1:
        raise bad("topk", f"is {topk}: must be at least 1 (1: a chain of drafts)")
    model = raw.get("model")
    if method == "ngram":
        if topk != 1:
            raise bad("topk", f"is {topk}: the ngram proposer drafts a chain (topk 1); trees need method eagle3")
        if model not in (None, "ngram", "[ngram]"):
            raise bad("model", "is given: the ngram proposer uses no draft model")
        model = None
    elif any(k in raw for k in ("prompt_lookup_max", "prompt_lookup_min")):
        key = "prompt_lookup_max" if "prompt_lookup_max" in raw else "prompt_lookup_min"
        raise bad(key, "applies to method ngram only")
    chain_tokens = steps + 1
    nodes = _int(raw, "num_draft_tokens", None)
    if topk == 1:
        if nodes is not None and nodes != chain_tokens:
            raise bad("num_draft_tokens", f"is {nodes}: with topk 1 the drafts are a chain of num_speculative_tokens "
                                          f"({steps}) tokens, so {chain_tokens} tokens are verified")
        nodes = chain_tokens
    else:
        most = 1 + max_tree_nodes(steps, topk)
        nodes = min(most, 8) if nodes is None else nodes
        if not 2 <= nodes <= min(most, MAX_TREE_TOKENS):
            raise bad("num_draft_tokens", f"is {nodes}: a tree of {steps} steps and topk {topk} verifies 2.."
                                          f"{min(most, MAX_TREE_TOKENS)} tokens (its root included)")
        if (steps - 1) * topk >= MAX_TREE_TOKENS:
            raise bad("topk", f"x (num_speculative_tokens - 1) must stay below {MAX_TREE_TOKENS}")
    if chain_tokens > MAX_TREE_TOKENS:
        raise bad("num_speculative_tokens", "is too large")
    lookup_max = _int(raw, "prompt_lookup_max", None)
    lookup_min = _int(raw, "prompt_lookup_min", None)
    lookup_max = lookup_max if lookup_max is not None else (lookup_min or 5)
    lookup_min = lookup_min if lookup_min is not None else lookup_max
    if lookup_min < 1:
        raise bad("prompt_lookup_min", f"is {lookup_min}: must be at least 1")
    if lookup_min > lookup_max:
        raise bad("prompt_lookup_min", f"({lookup_min}) must not exceed prompt_lookup_max ({lookup_max})")
    disable = _int(raw, "disable_by_batch_size", DEFAULT_DISABLE_BY_BATCH_SIZE)
    assert disable is not None
    if disable < 1:
        raise bad("disable_by_batch_size", f"is {disable}: must be at least 1")
    return SpeculativeConfig(method=method, model=model, num_speculative_tokens=steps, topk=topk,
                             num_draft_tokens=nodes, prompt_lookup_max=lookup_max, prompt_lookup_min=lookup_min,
                             disable_by_batch_size=disable)


SGLANG_ALGORITHMS = {"eagle3": "eagle3", "ngram": "ngram"}


def from_sglang_flags(algorithm: str | None, draft: str | None, steps: int | None, topk: int | None,
                      draft_tokens: int | None) -> dict[str, Any] | None:
    """SGLang's --speculative-algorithm EAGLE3 --speculative-draft-model-path M --speculative-num-steps
    N --speculative-eagle-topk K --speculative-num-draft-tokens T, as --speculative-config keys."""
    if algorithm is None and draft is None and steps is None and topk is None and draft_tokens is None:
        return None
    if algorithm is None:
        raise ConfigError("--speculative-draft-model-path and the step, top-k and draft-token counts need "
                          "--speculative-algorithm EAGLE3 (or NGRAM)", "speculative_algorithm")
    method = SGLANG_ALGORITHMS.get(algorithm.lower())
    if method is None:
        raise ConfigError(f"--speculative-algorithm {algorithm}: osserve speculates with EAGLE3 drafts or NGRAM "
                          "prompt lookup", "speculative_algorithm")
    raw: dict[str, Any] = {"method": method}
    for key, value in (("model", draft), ("num_speculative_tokens", steps), ("topk", topk),
                       ("num_draft_tokens", draft_tokens)):
        if value is not None:
            raw[key] = value
    return raw


def resolve_speculative(settings: object) -> SpeculativeConfig | None:
    """From the CLI's namespace or EngineArgs: --speculative-config, or SGLang's --speculative-*
    flags (not both)."""
    sglang = from_sglang_flags(*(getattr(settings, name, None) for name in (
        "speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps", "speculative_eagle_topk",
        "speculative_num_draft_tokens")))
    given = getattr(settings, "speculative_config", None)
    if sglang is not None and given is not None:
        raise ConfigError("give either --speculative-config or SGLang's --speculative-* flags, not both",
                          "speculative_config")
    return parse_speculative_config(sglang if sglang is not None else given)
