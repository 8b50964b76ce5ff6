"""The harmony vocabulary as llguidance's tokenizer, built offline from the same verified
`o200k_base.tiktoken` the harmony encoding reads (osserve/tokenizer.py), plus harmony's special
tokens by name, so grammars can address `<|channel|>` and the like by identity."""

from __future__ import annotations

import base64
import functools
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


@functools.cache
def harmony_lltokenizer() -> LLTokenizer:
    """The process's llguidance tokenizer (~1 s to build: once, off the step loop)."""
    from llguidance import LLTokenizer

    ranks = {}
    for line in ensure_vocab_file().read_bytes().splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    tok = load_tokenizer()
    special = {tok.decode([t]): t for t in sorted(tok.special_ids)}
    return LLTokenizer.from_tiktoken(  # type: ignore[attr-defined]
        encoder=ranks, special_tokens=special, pattern=O200K_PATTERN, eos_token=[RETURN, CALL],
        n_vocab=tok.vocab_size)
