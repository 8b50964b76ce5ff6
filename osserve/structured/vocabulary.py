"""The harmony vocabulary as llguidance's tokenizer, built offline from the same verified
`o200k_base.tiktoken` the harmony encoding reads (osserve/tokenizer.py), plus harmony's special
tokens by name, so grammars can address `<|channel|>` and the like by identity; and each token's
UTF-8 shape (where a character it starts ends), for following free text token by token."""

from __future__ import annotations

import base64
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from osserve.tokenizer import CALL, RETURN, ensure_vocab_file, load_tokenizer

if TYPE_CHECKING:
    from llguidance import LLTokenizer

# o200k_base's pre-tokenisation pattern (tiktoken's openai_public.py). llguidance uses it only to
# tokenise text it forces; masks and token checks read the vocabulary alone.
O200K_PATTERN = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])


SPECIAL = 255  # Utf8Shapes.lead of a special token (or an id without bytes)
ONLY_CONTINUATION = 255  # Utf8Shapes.tail of a token made of continuation bytes alone


@dataclass(frozen=True)
class Utf8Shapes:
    """Per token id, one byte each (bytes index fast): `lead`, how many UTF-8 continuation bytes
    (10xxxxxx) it starts with, which finish a character begun before it; `tail`, how many
    continuation bytes the character its last bytes begin still owes (0: it ends on a character
    boundary), counted from its first other byte; `whole`, 1 where the token is whole characters
    (lead and tail 0, not special): inside free text such a token changes nothing but the count."""

    lead: bytes
    tail: bytes
    whole: bytes


def _ranks() -> dict[bytes, int]:
    """The vocabulary file's tokens (read where needed, not kept: ~200k byte strings)."""
    ranks = {}
    for line in ensure_vocab_file().read_bytes().splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    return ranks


@functools.cache
def harmony_lltokenizer() -> LLTokenizer:
    """The process's llguidance tokenizer (~1 s to build: once, off the step loop)."""
    from llguidance import LLTokenizer

    ranks = _ranks()
    tok = load_tokenizer()
    special = {tok.decode([t]): t for t in sorted(tok.special_ids)}
    return LLTokenizer.from_tiktoken(  # type: ignore[attr-defined]
        encoder=ranks, special_tokens=special, pattern=O200K_PATTERN, eos_token=[RETURN, CALL],
        n_vocab=tok.vocab_size)


def _char_length(lead_byte: int) -> int:
    """The bytes of a UTF-8 character that starts with this byte (1 for ASCII and stray bytes)."""
    return 4 if lead_byte >= 0xF0 else 3 if lead_byte >= 0xE0 else 2 if lead_byte >= 0xC0 else 1


@functools.cache
def utf8_shapes() -> Utf8Shapes:
    """The vocabulary's Utf8Shapes (~0.2 s: once, off the step loop)."""
    n = load_tokenizer().vocab_size
    lead, tail = bytearray([SPECIAL] * n), bytearray(n)
    for token, rank in _ranks().items():
        k = 0
        while k < len(token) and token[k] & 0xC0 == 0x80:
            k += 1
        lead[rank] = min(k, SPECIAL - 1)
        if k == len(token):
            tail[rank] = ONLY_CONTINUATION
            continue
        last = len(token) - 1  # the last character's first byte
        while last > k and token[last] & 0xC0 == 0x80:
            last -= 1
        tail[rank] = max(0, _char_length(token[last]) - (len(token) - last))
    whole = bytes(int(a == 0 and b == 0) for a, b in zip(lead, tail, strict=True))
    return Utf8Shapes(bytes(lead), bytes(tail), whole)


@functools.cache
def token_bytes() -> list[bytes]:
    """Each token id's bytes (b"" for a special token or an id without bytes): ~0.1 s, once."""
    out = [b""] * load_tokenizer().vocab_size
    for token, rank in _ranks().items():
        out[rank] = token
    return out
