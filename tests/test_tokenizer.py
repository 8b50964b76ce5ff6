"""The offline harmony tokenizer: verified vocabulary, special tokens, non-ASCII round trips."""

from __future__ import annotations

import dataclasses
import hashlib
import random
from pathlib import Path

import pytest

from osserve import tokenizer as tk
from osserve.errors import TokenizerError


def test_vocab_file_is_the_official_one(tmp_path: Path) -> None:
    path = tk.ensure_vocab_file(tmp_path)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == tk.VOCAB_SHA256


def test_corrupt_cache_is_rebuilt(tmp_path: Path) -> None:
    path = tk.ensure_vocab_file(tmp_path)
    path.write_bytes(b"garbage")
    assert hashlib.sha256(tk.ensure_vocab_file(tmp_path).read_bytes()).hexdigest() == tk.VOCAB_SHA256


def test_corrupt_source_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tk, "_quicktok_vocab", lambda: b"\x05\x00\x00\x00\x03")
    with pytest.raises(TokenizerError, match="quicktok-v1"):
        tk.ensure_vocab_file(tmp_path)


def test_special_token_ids() -> None:
    t = tk.load_tokenizer()
    enc = t.encoding
    for text, tid in [("<|return|>", 200002), ("<|call|>", 200012), ("<|endoftext|>", 199999),
                      ("<|start|>", 200006), ("<|end|>", 200007), ("<|message|>", 200008),
                      ("<|channel|>", 200005), ("<|constrain|>", 200003)]:
        assert enc.encode(text, allowed_special="all") == [tid]
        assert t.is_special(tid)
    assert sorted(enc.stop_tokens_for_assistant_actions()) == [200002, 200012]
    assert t.encode("<|return|>") != [200002]  # user text never becomes a special token


def test_non_ascii_round_trip_and_incremental_decoding() -> None:
    t = tk.load_tokenizer()
    text = "héllo wörld — 你好 🙂 Здравствуй"
    ids = t.encode(text)
    assert t.decode(ids) == text
    dec = tk.IncrementalDecoder(t)
    pieces = [dec.push([i]) for i in t.encode("🙂🙂")] + [dec.flush()]
    assert "".join(pieces) == "🙂🙂" and all("\ufffd" not in p for p in pieces)
    raw = t.decode_bytes(t.encode("🙂"))
    split = tk.IncrementalDecoder(t)
    split.buffer = raw[:2]
    assert split.push([]) == "" and tk._complete_prefix_len(raw[:2]) == 0


def test_one_token_fast_path_decodes_as_the_general_path() -> None:
    """push([id]) with nothing held back reads a memo of whole-character tokens; the text stream
    must be the general path's, including tokens that end inside a character, and specials."""
    t = tk.load_tokenizer()
    general = dataclasses.replace(t, _piece_texts={})
    general.piece_text = lambda token_id: None  # type: ignore[method-assign]
    ids = t.encode("héllo — 你好 🙂🙂 Здравствуй \x00 ok") + [200002, 199999, 5, 200008]
    ids += random.Random(0).sample(range(199_998), 300)
    fast_dec, general_dec = tk.IncrementalDecoder(t), tk.IncrementalDecoder(general)
    fast = [fast_dec.push([i]) for i in ids] + [fast_dec.flush()]
    slow = [general_dec.push([i]) for i in ids] + [general_dec.flush()]
    assert fast == slow
    assert any(v is None for v in t._piece_texts.values())  # some tokens end inside a character
    assert "".join(fast) == t.decode_bytes(ids).decode("utf-8", errors="replace")
