"""--speculative-config and SGLang's flags: vLLM's keys, and a start-up error naming the key for
anything osserve cannot honour."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from osserve.errors import ConfigError
from osserve.speculative.config import SpeculativeConfig, parse_speculative_config, resolve_speculative


def test_vllm_json_and_defaults() -> None:
    cfg = parse_speculative_config('{"method": "eagle3", "model": "lmsys/EAGLE3-gpt-oss-120b-bf16", '
                                   '"num_speculative_tokens": 3, "draft_tensor_parallel_size": 1}')
    assert cfg == SpeculativeConfig("eagle3", "lmsys/EAGLE3-gpt-oss-120b-bf16", 3, 1, 4)
    assert cfg.lookahead_slots == 2 and cfg.max_drafts == 3 and not cfg.is_tree
    tree = parse_speculative_config({"method": "eagle3", "num_speculative_tokens": 5, "topk": 4,
                                     "num_draft_tokens": 8})
    assert tree is not None and tree.is_tree and tree.lookahead_slots == 16 and tree.max_drafts == 7
    ngram = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}')
    assert ngram is not None and (ngram.prompt_lookup_min, ngram.prompt_lookup_max) == (3, 3)
    assert ngram.lookahead_slots == 0
    assert parse_speculative_config('{"method": "ngram"}') == SpeculativeConfig("ngram", None, 3, 1, 4, 5, 5)
    assert parse_speculative_config('{"model": "[ngram]", "num_speculative_tokens": 2}').method == "ngram"  # type: ignore[union-attr]
    assert parse_speculative_config(None) is None


BAD: list[tuple[Any, str]] = [
    ("{not json", "speculative_config"),
    ('["eagle3"]', "speculative_config"),
    ('{"method": "eagle3", "num_speculative_token": 3}', "speculative_config.num_speculative_token"),
    ('{"method": "medusa"}', "speculative_config.method"),
    ('{"method": "ngram", "topk": 2}', "speculative_config.topk"),
    ('{"method": "ngram", "model": "some/draft"}', "speculative_config.model"),
    ('{"method": "eagle3", "num_speculative_tokens": 3, "num_draft_tokens": 6}', "speculative_config.num_draft_tokens"),
    ('{"method": "eagle3", "num_speculative_tokens": 2, "topk": 2, "num_draft_tokens": 9}',
     "speculative_config.num_draft_tokens"),  # 2 + 4 candidates and the root: at most 7
    ('{"method": "eagle3", "num_speculative_tokens": 3, "topk": 4, "num_draft_tokens": 1}',
     "speculative_config.num_draft_tokens"),
    ('{"method": "eagle3", "num_speculative_tokens": 0}', "speculative_config.num_speculative_tokens"),
    ('{"method": "eagle3", "num_speculative_tokens": "3"}', "speculative_config.num_speculative_tokens"),
    ('{"method": "eagle3", "topk": 0}', "speculative_config.topk"),
    ('{"method": "eagle3", "prompt_lookup_max": 3}', "speculative_config.prompt_lookup_max"),
    ('{"method": "ngram", "prompt_lookup_min": 4, "prompt_lookup_max": 2}', "speculative_config.prompt_lookup_min"),
    ('{"method": "eagle3", "draft_tensor_parallel_size": 2}', "speculative_config.draft_tensor_parallel_size"),
    ('{"method": "eagle3", "disable_by_batch_size": 0}', "speculative_config.disable_by_batch_size"),
]


@pytest.mark.parametrize("value,param", BAD, ids=[b[1] + ":" + b[0][:30] for b in BAD])
def test_bad_input_names_the_key(value: Any, param: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_speculative_config(value)
    assert e.value.param == param
    key = param.split(".")[-1]
    assert key in e.value.message or key.replace("_", "-") in e.value.message


def flags(**kw: Any) -> argparse.Namespace:
    names = ("speculative_config", "speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
             "speculative_eagle_topk", "speculative_num_draft_tokens")
    return argparse.Namespace(**{n: kw.get(n) for n in names})


def test_sglang_flags() -> None:
    cfg = resolve_speculative(flags(speculative_algorithm="EAGLE3", speculative_draft_model_path="d",
                                    speculative_num_steps=5, speculative_eagle_topk=4, speculative_num_draft_tokens=8))
    assert cfg == SpeculativeConfig("eagle3", "d", 5, 4, 8)
    with pytest.raises(ConfigError, match="not both"):
        resolve_speculative(flags(speculative_config='{"method": "ngram"}', speculative_algorithm="NGRAM"))
    with pytest.raises(ConfigError, match="need --speculative-algorithm"):
        resolve_speculative(flags(speculative_num_steps=3))
    with pytest.raises(ConfigError, match="--speculative-algorithm MEDUSA"):
        resolve_speculative(flags(speculative_algorithm="MEDUSA"))
    with pytest.raises(ConfigError) as e:  # SGLang's rule: a chain verifies num_steps + 1 tokens
        resolve_speculative(flags(speculative_algorithm="EAGLE3", speculative_num_steps=3, speculative_eagle_topk=1,
                                  speculative_num_draft_tokens=5))
    assert e.value.param == "speculative_config.num_draft_tokens"


def test_speculative_decoding_with_several_ranks_is_refused_before_loading() -> None:
    from osserve.engine.load import EngineArgs, build_engine

    args = EngineArgs(load_format="dummy", preset="tiny", device="cpu", tensor_parallel_size=2,
                      speculative_config='{"method": "ngram"}')
    with pytest.raises(ConfigError, match="tensor-parallel-size > 1 is not supported yet") as err:
        build_engine(args)
    assert err.value.param == "speculative_config"
