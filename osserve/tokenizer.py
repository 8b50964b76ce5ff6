"""The harmony tokenizer, offline.

openai-harmony reads `o200k_base.tiktoken` from the folder in `TIKTOKEN_ENCODINGS_BASE` and
otherwise downloads it. We never let it download: the `quicktok-v1` package ships the same
vocabulary (`quicktok/data/o200k.vocab`: a little-endian u32 count, then per entry a u16 byte
length, the bytes and a u32 rank). Written sorted by rank as `base64(bytes) rank\\n` it is the
official file, byte for byte, which the sha256 below proves before harmony sees it.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import os
import struct
import tempfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from osserve.errors import TokenizerError

VOCAB_FILE = "o200k_base.tiktoken"
VOCAB_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
FIX = "reinstall it with `pip install --force-reinstall quicktok-v1` (or run scripts/setup.sh)"

# Harmony's special tokens (DESIGN.md §2).
ENDOFTEXT = 199999
RETURN = 200002
CONSTRAIN = 200003
CHANNEL = 200005
START = 200006
END = 200007
MESSAGE = 200008
CALL = 200012


def cache_dir() -> Path:
    return Path(os.environ.get("OSSERVE_CACHE_DIR", Path.home() / ".cache" / "osserve")) / "tiktoken"


def _quicktok_vocab() -> bytes:
    try:
        return resources.files("quicktok").joinpath("data/o200k.vocab").read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as e:
        raise TokenizerError(f"the o200k vocabulary of quicktok-v1 is missing ({e}): {FIX}") from e


def tiktoken_text_from_quicktok(raw: bytes) -> bytes:
    """quicktok's binary vocabulary -> the text of o200k_base.tiktoken."""
    try:
        (count,) = struct.unpack_from("<I", raw, 0)
        off, entries = 4, []
        for _ in range(count):
            (n,) = struct.unpack_from("<H", raw, off)
            token = raw[off + 2: off + 2 + n]
            (rank,) = struct.unpack_from("<I", raw, off + 2 + n)
            entries.append((rank, token))
            off += 6 + n
    except struct.error as e:
        raise TokenizerError(f"quicktok's o200k.vocab is truncated or corrupt: {FIX}") from e
    entries.sort()
    return b"".join(base64.b64encode(tok) + b" %d\n" % rank for rank, tok in entries)


def ensure_vocab_file(directory: Path | None = None) -> Path:
    """The verified `o200k_base.tiktoken` in `directory` (written there if missing or corrupt)."""
    directory = directory or cache_dir()
    path = directory / VOCAB_FILE
    if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == VOCAB_SHA256:
        return path
    text = tiktoken_text_from_quicktok(_quicktok_vocab())
    digest = hashlib.sha256(text).hexdigest()
    if digest != VOCAB_SHA256:
        raise TokenizerError(
            f"the vocabulary built from quicktok-v1 has sha256 {digest}, expected {VOCAB_SHA256}: {FIX}"
        )
    directory.mkdir(parents=True, exist_ok=True)
    # Write then rename, so a concurrent reader never sees half a file.
    with tempfile.NamedTemporaryFile(dir=directory, delete=False) as tmp:
        tmp.write(text)
    os.replace(tmp.name, path)
    return path


@dataclass
class Tokenizer:
    """The harmony encoding (openai_harmony.HarmonyEncoding) and plain-text helpers."""

    encoding: object  # openai_harmony.HarmonyEncoding (typed loosely: a compiled extension)
    vocab_size: int = 201088
    special_ids: frozenset[int] = field(default_factory=frozenset)
    # token id -> its text when its bytes are whole UTF-8 characters, else None: a memo of a pure
    # function (at most one entry per vocabulary id), read once per streamed token by every decoder.
    _piece_texts: dict[int, str | None] = field(default_factory=dict, repr=False, compare=False)

    def encode(self, text: str) -> list[int]:
        """Ordinary text; text that looks like a special token is encoded as plain text."""
        return self.encoding.encode(text, disallowed_special=())  # type: ignore[attr-defined]

    def decode(self, ids: list[int]) -> str:
        return self.encoding.decode(ids)  # type: ignore[attr-defined]

    def decode_bytes(self, ids: list[int]) -> bytes:
        return bytes(self.encoding._inner.decode_bytes(list(ids)))  # type: ignore[attr-defined]

    def is_special(self, token_id: int) -> bool:
        return token_id in self.special_ids

    def piece_text(self, token_id: int) -> str | None:
        """The text of one token that decodes on its own (complete UTF-8 characters), else None."""
        try:
            return self._piece_texts[token_id]
        except KeyError:
            raw = self.decode_bytes([token_id])
            text = raw.decode("utf-8", errors="replace") if _complete_prefix_len(raw) == len(raw) else None
            self._piece_texts[token_id] = text
            return text


@functools.cache
def load_tokenizer() -> Tokenizer:
    """The process's tokenizer (loaded once: the encoding is immutable)."""
    path = ensure_vocab_file()
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(path.parent)
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    try:
        enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    except Exception as e:  # harmony's own error types are not exported
        raise TokenizerError(f"openai-harmony could not load {path}: {e}") from e
    special = frozenset(t for t in range(199_998, 201_088) if enc.is_special_token(t))
    return Tokenizer(encoding=enc, special_ids=special)


class IncrementalDecoder:
    """Decodes a token stream piece by piece, holding back an incomplete UTF-8 character."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.buffer = b""

    def push(self, ids: list[int]) -> str:
        if not ids:
            return ""
        if len(ids) == 1 and not self.buffer:  # the streaming case: one token, nothing held back
            text = self.tokenizer.piece_text(ids[0])
            if text is not None:
                return text
        self.buffer += self.tokenizer.decode_bytes(ids)
        cut = _complete_prefix_len(self.buffer)
        text, self.buffer = self.buffer[:cut].decode("utf-8", errors="replace"), self.buffer[cut:]
        return text

    def flush(self) -> str:
        text, self.buffer = self.buffer.decode("utf-8", errors="replace"), b""
        return text


def _complete_prefix_len(data: bytes) -> int:
    """Length of the longest prefix of `data` that does not end inside a UTF-8 character."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:  # ASCII: everything up to here is complete
            return len(data)
        if byte >= 0xC0:  # a lead byte: complete only if its continuation bytes are all here
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return len(data) if back >= need else len(data) - back
    return len(data)  # only continuation bytes: invalid anyway, let `replace` handle it
