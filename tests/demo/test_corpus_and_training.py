"""The demo corpus (splits, rendering, answers) and the training loop on a CPU."""

from __future__ import annotations

import random
import re
from pathlib import Path

from safetensors import safe_open

from osserve.demo.corpus import draw_examples, split_of, tokenize
from osserve.demo.evaluate import heldout_examples, valid_call
from osserve.demo.train import TrainConfig, train
from osserve.harmony.render import render_chat
from osserve.tokenizer import load_tokenizer


def test_heldout_prompts_never_appear_in_training() -> None:
    train_texts = {ex.user_text for ex in draw_examples(random.Random(0), 3000, "train")}
    held = heldout_examples(300)
    assert len(held) == 300 and {ex.task for ex in held} >= {"addition", "conversion", "letter_count", "tool_call"}
    assert all(split_of(ex.user_text) == "heldout" for ex in held if ex.task != "greeting")
    assert not {ex.user_text for ex in held if ex.task != "greeting"} & train_texts


def test_completions_follow_the_served_prompt_and_end_as_harmony_requires() -> None:
    enc = load_tokenizer().encoding
    for ex in draw_examples(random.Random(1), 200, "train"):
        ids, prompt_len = tokenize(ex)
        assert ids[:prompt_len] == render_chat(ex.messages, tools=ex.tools, reasoning_effort=ex.effort).token_ids
        text = enc.decode(ids[prompt_len:])
        assert text.startswith("<|channel|>analysis<|message|>" + ex.reasoning + "<|end|>")
        if ex.tool_call is not None:
            assert text.endswith(f"to=functions.{ex.tool_call.name}<|channel|>commentary <|constrain|>json"
                                 f"<|message|>{ex.tool_call.arguments}<|call|>")
            assert valid_call(ex.tool_call.name, ex.tool_call.arguments, ex.tools) is not None
        else:
            assert text.endswith(f"<|channel|>final<|message|>{ex.answer}<|return|>")
        if ex.task == "addition":
            a, b, s = map(int, re.fullmatch(r"(\d+) \+ (\d+) = (\d+)\.", ex.answer or "").groups())  # type: ignore[union-attr]
            assert a + b == s


def test_training_lowers_the_loss_and_writes_a_compact_checkpoint(tmp_path: Path) -> None:
    path = train(TrainConfig(out=str(tmp_path / "d.safetensors"), steps=20, batch_size=6, examples=120, warmup=4,
                             device="cpu"))
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    assert meta["steps_done"] == "20" and meta["seed"] == "0"
    # the mean loss over the 20 steps, from ~12.2 (uniform over the vocabulary) at step 0
    assert float(meta["final_loss"]) < 10.0
