"""The demo corpus (splits, rendering, answers) and the training loop on a CPU."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from safetensors import safe_open

from osserve.demo.corpus import TIME_TOOL, WEATHER_TOOL, draw_examples, namespaces, split_of, tokenize
from osserve.demo.evaluate import fake_python, heldout_examples, valid_call
from osserve.demo.train import TrainConfig, train
from osserve.harmony.render import render_chat
from osserve.tokenizer import load_tokenizer


@pytest.mark.parametrize("version", [1, 2])
def test_heldout_prompts_never_appear_in_training(version: int) -> None:
    train_texts = {ex.user_text for ex in draw_examples(random.Random(0), 3000, "train", version)}
    held = heldout_examples(300, version=version)
    assert len(held) == 300 and {ex.task for ex in held} >= {"addition", "conversion", "letter_count", "tool_call"}
    assert all(split_of(ex.user_text) == "heldout" for ex in held if ex.task != "greeting")
    assert not {ex.user_text for ex in held if ex.task != "greeting"} & train_texts
    assert not any(ex.python for ex in held)  # python prompts are asked apart (Chat Completions has no python)
    if version == 2:
        with_python = heldout_examples(100, version=2, python=True)
        assert {ex.task for ex in with_python} >= {"python_call", "no_python", "addition"}


def test_completions_follow_the_served_prompt_and_end_as_harmony_requires() -> None:
    enc = load_tokenizer().encoding
    for ex in draw_examples(random.Random(1), 400, "train"):
        ids, prompt_len = tokenize(ex)
        assert ids[:prompt_len] == render_chat(ex.messages, tools=ex.tools, reasoning_effort=ex.effort,
                                               namespaces=namespaces(ex)).token_ids
        text = enc.decode(ids[prompt_len:])
        assert text.startswith("<|channel|>analysis<|message|>" + ex.reasoning + "<|end|>")
        assert ("## python" in enc.decode(ids[:prompt_len])) == ex.python
        if ex.task == "python_call":
            assert ex.tool_call is not None and ex.python
            assert text.endswith(f"<|start|>assistant to=python<|channel|>analysis code<|message|>"
                                 f"{ex.tool_call.arguments}<|call|>")
            a, b = ex.extra["a"], ex.extra["b"]
            assert fake_python(ex.tool_call.arguments) == f"{a * b}\n"
        elif ex.tool_call is not None:
            assert text.endswith(f"to=functions.{ex.tool_call.name}<|channel|>commentary <|constrain|>json"
                                 f"<|message|>{ex.tool_call.arguments}<|call|>")
            assert valid_call(ex.tool_call.name, ex.tool_call.arguments, ex.tools) is not None
        else:
            assert text.endswith(f"<|channel|>final<|message|>{ex.answer}<|return|>")
        if ex.task == "addition":
            a, b, s = map(int, re.fullmatch(r"(\d+) \+ (\d+) = (\d+)\.", ex.answer or "").groups())  # type: ignore[union-attr]
            assert a + b == s and f"Total: {s}." in ex.reasoning  # corpus 2: digit by digit, with the carry
        if ex.task == "python_answer":
            a, b = ex.extra["a"], ex.extra["b"]
            assert text.endswith(f"<|channel|>final<|message|>{a} * {b} = {a * b}.<|return|>")
            assert f"python to=assistant<|channel|>analysis<|message|>{a * b}\n<|end|>" in enc.decode(ids[:prompt_len])


def test_corpus_1_is_what_the_shipped_weights_learned() -> None:
    from osserve.demo.compact import corpus_version
    from osserve.demo.weights import DEMO_WEIGHTS

    assert corpus_version(DEMO_WEIGHTS) == 1
    first = draw_examples(random.Random(0), 50, "train", version=1)
    assert not any(ex.python or ex.task.startswith("python") for ex in first)
    assert all(t.description in (WEATHER_TOOL.description, TIME_TOOL.description) for ex in first for t in ex.tools)
    sums = [ex for ex in first if ex.task == "addition"]
    assert sums and all("Tens: " in ex.reasoning and "Ones: " in ex.reasoning for ex in sums)


def test_corpus_2_declares_tools_as_users_write_them() -> None:
    tool_calls = [ex for ex in draw_examples(random.Random(3), 1500, "train", version=2) if ex.task == "tool_call"]
    descriptions = {t.description for ex in tool_calls for t in ex.tools}
    assert len(descriptions) >= 8 and "" in descriptions
    located = [ex for ex in tool_calls if ex.tool_call is not None and '"location"' in ex.tool_call.arguments]
    assert located and all(valid_call(ex.tool_call.name, ex.tool_call.arguments, ex.tools)  # type: ignore[union-attr]
                           for ex in located)


def test_training_lowers_the_loss_and_writes_a_compact_checkpoint(tmp_path: Path) -> None:
    path = train(TrainConfig(out=str(tmp_path / "d.safetensors"), steps=20, batch_size=6, examples=120, warmup=4,
                             device="cpu"))
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    assert meta["steps_done"] == "20" and meta["seed"] == "0" and meta["corpus_version"] == "2"
    # the mean loss over the 20 steps, from ~12.2 (uniform over the vocabulary) at step 0
    assert float(meta["final_loss"]) < 10.0


def test_fine_tuning_keeps_the_init_tokens_rows_and_serves(tmp_path: Path) -> None:
    """--init: the shipped checkpoint's tokens keep their rows and order, corpus 2's new tokens are
    appended, the metadata names the init, and the result (a near-zero rate: the shipped function)
    loads in the engine and answers as the shipped model does."""
    from safetensors.torch import load_file

    from osserve.demo.compact import compact_vocab, expand_compact
    from osserve.demo.evaluate import evaluate, llm_asker
    from osserve.demo.weights import DEMO_WEIGHTS
    from osserve.engine.llm import LLM

    path = train(TrainConfig(out=str(tmp_path / "ft.safetensors"), init=str(DEMO_WEIGHTS), steps=3, batch_size=2,
                             examples=40, warmup=1, lr=1e-6, qat_fraction=1.0, device="cpu"))
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    assert meta["init"] == DEMO_WEIGHTS.name and meta["init_corpus_version"] == "1" and meta["corpus_version"] == "2"
    old, new = compact_vocab(DEMO_WEIGHTS), compact_vocab(path)
    assert new[: len(old)] == old and len(new) > len(old) and len(set(new)) == len(new)
    before, after = load_file(str(DEMO_WEIGHTS)), load_file(str(path))
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        moved = (after[name][: len(old)].float() - before[name].float()).abs().max()
        assert moved < 0.05, (name, moved)
    llm = LLM(model=str(expand_compact(path, tmp_path / "hf")), device="cpu", max_model_len=1024)
    prompts = [ex for ex in heldout_examples(60, version=1) if ex.task in ("addition", "conversion")][:4]
    report = evaluate(llm_asker(llm), prompts)
    assert report.answers_right == len(prompts), report.failures
