"""Logprobs in OpenAI's two wire formats (chat's `content` list, completions' parallel lists)."""

from __future__ import annotations

from typing import Any

from osserve.engine.core.outputs import TokenLogprob
from osserve.tokenizer import Tokenizer


def _token(tok: Tokenizer, token_id: int) -> tuple[str, list[int]]:
    raw = tok.decode_bytes([token_id])
    return raw.decode("utf-8", errors="replace"), list(raw)


def chat_logprobs(tok: Tokenizer, items: list[TokenLogprob] | None) -> dict[str, Any] | None:
    if items is None:
        return None
    content = []
    for lp in items:
        text, raw = _token(tok, lp.token_id)
        top = []
        for tid, val in lp.top:
            t_text, t_raw = _token(tok, tid)
            top.append({"token": t_text, "logprob": val, "bytes": t_raw})
        content.append({"token": text, "logprob": lp.logprob, "bytes": raw, "top_logprobs": top})
    return {"content": content, "refusal": None}  # no refusal channel in gpt-oss; the key is required


def completion_logprobs(tok: Tokenizer, items: list[TokenLogprob], offset: int = 0) -> dict[str, Any]:
    tokens, token_lps, tops, offsets = [], [], [], []
    for lp in items:
        text, _ = _token(tok, lp.token_id)
        tokens.append(text)
        token_lps.append(lp.logprob)
        tops.append({_token(tok, tid)[0]: val for tid, val in lp.top})
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}
