"""Where a JSON answer stands, byte by byte, and which tokens would overflow a string's maxLength
(length_bounds.py says why the bounds are enforced here and not in the grammar).

JsonCursor reads the bytes of an answer the grammar accepted (it recognises, it does not
validate): a stack of the open objects and arrays with their schemas, and inside a string its
bound (length_bounds.stripped_bound of its schema) and the characters written so far. Characters
are counted as llguidance counts them: the decoded string's, so one per UTF-8 character (at its
first byte) and one per escape sequence (at its backslash).

TokenRuns.clear_overflows clears, in a row's mask from the grammar without bounds, the tokens the
bounds forbid:
- inside a bounded string with r characters left, every token whose characters before its first
  unescaped quote exceed r (one AND with a mask precomputed per r);
- anywhere, a token that would also open another bounded string and overflow it (`", "abc…`): the
  few tokens with a long enough quoted run are tried on a copy of the cursor.
Mid-escape (a token ended inside `\\u00e9`) the row is left to the grammar with bounds
(bounded.Bounded.fills).

JsonCursor.position_key names where the answer stands when, inside a value string, the grammar
without bounds allows the same tokens whatever the string holds so far: the string's own
characters are free (its bound stripped, no minLength), the last token ended on a character
boundary outside any escape, and what may follow the string is fixed by the path to it (each
object's keys so far, each array's index). Rows at one such position share one mask
(matchers.Grammars), as free text's rows do.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from osserve.structured.length_bounds import LengthBounds, item_schema, property_schema, resolve, stripped_bound
from osserve.structured.vocabulary import token_bytes

QUOTE, BACKSLASH = 0x22, 0x5C
STRUCTURE = frozenset(b'"{}[],')  # the bytes JsonCursor reacts to outside a string
POSITION = b"\x00json"  # how a position key starts (JsonCursor.position_key; a channel's name never has a NUL)


def string_byte(escape: int, byte: int) -> tuple[int, bool, bool]:
    """One byte inside a JSON string, given the escape state before it (0: none, -1: right after
    a backslash, 1-4: a \\u escape's hex digits still to come): (the escape state after it, whether
    it starts a character, whether it is the closing quote). The one place characters are counted."""
    if escape == -1:  # the escape's letter
        return (4 if byte == ord("u") else 0), False, False
    if escape > 0:
        return escape - 1, False, False
    if byte == QUOTE:
        return 0, False, True
    return (-1 if byte == BACKSLASH else 0), byte & 0xC0 != 0x80, False


@dataclass
class Frame:
    schema: Any
    is_object: bool
    key: str | None = None  # an object's key whose value comes next (None: a key comes next)
    index: int = 0  # an array's item
    keys: tuple[str, ...] = ()  # an object's keys so far, in order (the current one included)

    def position(self) -> tuple[Any, ...] | None:
        """This frame's part of a position key (JsonCursor.position_key), or None where the
        grammar's continuations could vary without end: an object that allows other keys. An
        array's index counts only below the last index its schema treats apart (its prefixItems,
        minItems, maxItems); past it every item is alike."""
        schema = self.schema if isinstance(self.schema, dict) else {}
        if self.is_object:
            if schema.get("additionalProperties", True) is not False:
                return None
            return ("o", self.keys)
        apart = max(len(schema.get("prefixItems", [])), _count(schema.get("minItems")), _count(schema.get("maxItems")))
        return ("a", min(self.index, apart))


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass
class JsonCursor:
    bounds: LengthBounds
    stack: list[Frame] = field(default_factory=list)
    in_string: bool = False
    is_key: bool = False
    key_bytes: bytearray = field(default_factory=bytearray)
    bound: int | None = None  # the open string's maxLength (None: unbounded)
    chars: int = 0  # its characters so far
    escape: int = 0  # bytes of an escape still to come: -1 right after the backslash, 1-4 hex digits
    overflow: bool = False  # some string went past its bound (a token that did so is forbidden)
    ended: bool = False  # the root value is complete
    string_key: bytes | None = None  # the open string's position key, where its mask depends on that alone
    split_char: bool = False  # the last token fed ended inside a character (or held no character's start)

    def clone(self) -> JsonCursor:
        """A copy to try a token on (the schemas shared, not copied)."""
        return replace(self, stack=[replace(f) for f in self.stack], key_bytes=bytearray(self.key_bytes))

    def feed_token(self, token: int, runs: TokenRuns) -> None:
        """feed() a token of runs' vocabulary, without its byte loop where the token cannot change
        more than the open string's count: text inside a value string, or bytes between values
        that open or close nothing (digits, spaces, `:`)."""
        self.split_char = bool(runs.ends_split[token])
        if self.in_string:
            chars = runs.plain_chars[token]
            if chars >= 0 and not self.escape and not self.is_key:
                self._count(chars)
                return
        elif runs.inert[token]:
            return
        self.feed(runs.vocab[token])

    def position_key(self) -> bytes | None:
        """The key of the shared mask at this point (module docstring), or None: not inside a
        value string whose mask depends on its position alone, or not at a character boundary
        outside an escape there."""
        if not self.in_string or self.escape or self.split_char:
            return None
        return self.string_key

    def _string_key(self, node: Any) -> bytes | None:
        """A value string's position key as it opens (its path is fixed until it closes), or None:
        its characters are not free (a bound kept, a minLength) or its path's continuations vary
        without end (Frame.position)."""
        if self.bound is None or isinstance(node, dict) and node.get("minLength"):
            return None
        path = []
        for frame in self.stack:
            part = frame.position()
            if part is None:
                return None
            path.append(part)
        return POSITION + repr(path).encode()

    def feed(self, data: bytes) -> None:
        for byte in data:
            if self.in_string:
                self._string_byte(byte)
            elif not self.ended:
                self._structure_byte(byte)

    @property
    def remaining(self) -> int | None:
        """Characters left in the open string where it is bounded and the next byte starts a
        character (None: not in a bounded string)."""
        if not self.in_string or self.bound is None:
            return None
        return self.bound - self.chars

    def _value_schema(self) -> Any:
        root = self.bounds.schema
        if not self.stack:
            return resolve(root, root)
        top = self.stack[-1]
        if top.is_object:
            return property_schema(root, top.schema, top.key or "")
        return item_schema(root, top.schema, top.index)

    def _structure_byte(self, byte: int) -> None:
        top = self.stack[-1] if self.stack else None
        if byte == QUOTE:
            self.in_string, self.chars, self.escape = True, 0, 0
            self.is_key = top is not None and top.is_object and top.key is None
            self.key_bytes.clear()
            node = None if self.is_key else self._value_schema()
            self.bound = stripped_bound(node)
            self.string_key = self._string_key(node)
        elif byte in b"{[":
            self.stack.append(Frame(self._value_schema(), byte == ord("{")))
        elif byte in b"}]":
            if self.stack:
                self.stack.pop()
            self.ended = not self.stack
        elif byte == ord(",") and top is not None:
            if top.is_object:
                top.key = None
            else:
                top.index += 1

    def _string_byte(self, byte: int) -> None:
        if self.is_key:
            self.key_bytes.append(byte)
        self.escape, starts, closes = string_byte(self.escape, byte)
        if closes:
            self.in_string = False
            if self.is_key and self.stack:
                try:
                    key = json.loads(b'"' + bytes(self.key_bytes[:-1]) + b'"')
                except ValueError:
                    key = ""
                self.stack[-1].key = key
                self.stack[-1].keys += (key,)
            elif not self.stack:
                self.ended = True
        elif starts:
            self._count(1)

    def _count(self, chars: int) -> None:
        """The open string's characters grow by `chars` (an overflow is remembered)."""
        self.chars += chars
        if self.bound is not None and self.chars > self.bound:
            self.overflow = True


@dataclass(frozen=True)
class TokenRuns:
    """Per token of the vocabulary, what the filter needs (built once, off the step loop):
    `first`: its characters before its first unescaped quote, read as string content from a
    character boundary; `later_inside` / `later_outside`: the most characters of any later quoted
    run (a string it opens), starting inside a string or outside one."""

    vocab: list[bytes] = field(repr=False)
    first: np.ndarray
    later_inside: np.ndarray
    later_outside: np.ndarray
    plain_chars: list[int] = field(repr=False)  # its characters where it holds no quote or backslash, else -1
    inert: bytes = field(repr=False)  # 1 where it holds none of STRUCTURE: outside a string it changes nothing
    ends_split: bytes = field(repr=False)  # 1 where its last character is cut short, or it starts none
    _suspects: dict[tuple[bool, int], np.ndarray] = field(default_factory=dict, repr=False, compare=False)

    @functools.cached_property
    def first_masks(self) -> np.ndarray:
        """[R, words] int32: row r allows the tokens with first <= r (R = the longest first run;
        at r >= R nothing is cleared)."""
        limit = int(self.first.max())
        words = (len(self.first) + 31) // 32
        out = np.zeros((limit, words), dtype=np.int32)
        for r in range(limit):
            bits = np.packbits(self.first <= r, bitorder="little")
            out[r].view(np.uint8)[: len(bits)] = bits
        return out

    def suspects(self, inside: bool, smallest: int) -> np.ndarray:
        """Tokens whose later runs could overflow a bound of at least `smallest`, starting inside a
        string or outside one (kept: one schema's bounds meet the same few tokens every step)."""
        key = (inside, smallest)
        if key not in self._suspects:
            self._suspects[key] = np.flatnonzero((self.later_inside if inside else self.later_outside) > smallest)
        return self._suspects[key]

    def clear_overflows(self, cursor: JsonCursor, row: np.ndarray, smallest: int) -> None:
        """Clear the row's tokens (int32 mask words, from the grammar without bounds) that would
        overflow a bound; `smallest` is the schema's smallest. The cursor is not inside an escape."""
        if cursor.ended:
            return
        remaining = cursor.remaining
        if remaining is not None and remaining < len(self.first_masks):
            row &= self.first_masks[max(remaining, 0)]
        bits = row.view(np.uint32)
        for t in self.suspects(cursor.in_string, smallest):
            if bits[t >> 5] >> (t & 31) & 1:
                trial = cursor.clone()
                trial.feed(self.vocab[t])
                if trial.overflow:
                    bits[t >> 5] &= ~np.uint32(1 << (t & 31))


def token_runs(vocab: list[bytes]) -> TokenRuns:
    n = len(vocab)
    first, later_in, later_out = np.zeros(n, np.int32), np.zeros(n, np.int32), np.zeros(n, np.int32)
    plain_chars = [-1] * n
    for t, data in enumerate(vocab):
        if QUOTE not in data and BACKSLASH not in data:  # most tokens: plain text, no string opened
            first[t] = plain_chars[t] = sum(1 for b in data if b & 0xC0 != 0x80)
            continue
        first[t], later_in[t] = _runs(data, inside=True)
        _, later_out[t] = _runs(data, inside=False)
    inert = bytes(STRUCTURE.isdisjoint(data) for data in vocab)
    return TokenRuns(vocab, first, later_in, later_out, plain_chars, inert, bytes(map(_ends_split, vocab)))


def _ends_split(data: bytes) -> bool:
    """Whether the bytes end inside a UTF-8 character: its lead byte announces more bytes than
    follow it, or no byte starts a character at all (the state after them depends on before)."""
    for back, byte in enumerate(reversed(data)):
        if byte & 0xC0 != 0x80:  # the last character's first byte
            size = 1 if byte < 0x80 else 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return size > back + 1
    return True


def _runs(data: bytes, inside: bool) -> tuple[int, int]:
    """(characters of the run before the first unescaped quote, when the token starts inside a
    string; the most characters of any run inside a string the token opens)."""
    runs: list[int] = []  # characters of each run inside a string, in order
    opened_before = inside
    count = escape = 0
    for b in data:
        if not inside:
            if b == QUOTE:
                inside, count, escape = True, 0, 0
            continue
        escape, starts, closes = string_byte(escape, b)
        if closes:
            runs.append(count)
            inside = False
        count += starts
    if inside:
        runs.append(count)
    if opened_before:
        return runs[0], max(runs[1:], default=0)
    return 0, max(runs, default=0)


@functools.cache
def vocabulary_runs() -> TokenRuns:
    """The harmony vocabulary's TokenRuns (~0.5 s: once, off the step loop)."""
    runs = token_runs(token_bytes())
    runs.first_masks  # noqa: B018 - built here, in the compile thread, not at a step
    return runs
