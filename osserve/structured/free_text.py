"""Where a harmony turn stands with respect to its grammar's free channels, token by token: so a
step's mask can be known without asking llguidance.

harmony_lark opens each free channel (grammar.free_channels: the analysis, a preamble, a final
answer without a format) with `<|channel|>NAME<|message|>` at the start of the turn or right after
a free channel closed with `<|end|><|start|>assistant`, and each NAME opens exactly one rule of the
grammar. Its text is `/(?s:.*)/`, up to the channel's budget of tokens where it has one, then the
closing special token. Inside it the grammar's state, and so the mask (any text, the closing token),
is the same at every character boundary while the budget is not near its end; elsewhere (inside a
character split over tokens, the budget's last tokens, anything after the first constrained part)
it is not known here. tests/structured/test_free_masks.py checks that claim against llguidance on
random walks through the grammars.

The tracker reads only tokens the grammar accepted: it recognises, it does not validate (a token
that does not fit what it expects turns it off for good, which only costs the fast path).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from osserve.structured.vocabulary import ONLY_CONTINUATION, SPECIAL, Utf8Shapes
from osserve.tokenizer import CHANNEL, END, MESSAGE, START

BUDGET_MARGIN = 1  # the budget's last tokens are the grammar's to mask (it closes the channel at the end)
MAX_HEADER = 64  # bytes of a channel name or role: longer is no free channel's
UNBOUNDED = 1 << 62  # FreeText.limit of a channel without a budget


class Phase(enum.Enum):
    TURN = "turn"  # where a channel may open: the turn's start, or after a free channel's <|start|>assistant
    NAME = "name"  # after <|channel|>: the channel's name
    TEXT = "text"  # inside a free channel's text
    CLOSED = "closed"  # after a free channel's <|end|>
    ROLE = "role"  # after <|start|>: the role's name
    OFF = "off"  # in a constrained part (or lost): nothing more is known here


@dataclass
class FreeText:
    """One request's position, fed each token its grammar accepted."""

    budgets: dict[bytes, int | None]  # free channel name -> its token budget (None: unbounded)
    shapes: Utf8Shapes = field(repr=False)
    phase: Phase = Phase.TURN
    header: bytearray = field(default_factory=bytearray)  # the channel name or role read so far
    channel: bytes = b""  # the free channel whose text this is (Phase.TEXT)
    count: int = 0  # tokens of that text so far
    owed: int = 0  # continuation bytes its last character still owes (0: on a character boundary)
    limit: int = 0  # the count from which the channel's budget is the grammar's to mask (free_channel)

    def feed(self, token: int, token_bytes: bytes | None = None) -> None:
        """Advance past one accepted token. token_bytes: its bytes, where the caller has them (a
        header's tokens need them; text needs only the shapes)."""
        if self.phase is Phase.OFF:
            return
        special = self.shapes.lead[token] == SPECIAL
        if self.phase is Phase.TEXT:
            if special:
                self.phase = Phase.CLOSED if token == END else Phase.OFF
            else:
                self._text(token)
        elif self.phase is Phase.TURN:
            self._enter(Phase.NAME if token == CHANNEL else Phase.OFF)
        elif self.phase is Phase.NAME:
            if token == MESSAGE:
                name = bytes(self.header)
                if name in self.budgets:
                    budget = self.budgets[name]
                    self.channel, self.count, self.owed = name, 0, 0
                    self.limit = UNBOUNDED if budget is None else budget - BUDGET_MARGIN
                self.phase = Phase.TEXT if name in self.budgets else Phase.OFF
            else:
                self._header(token, special, token_bytes)
        elif self.phase is Phase.CLOSED:
            self._enter(Phase.ROLE if token == START else Phase.OFF)
        elif self.phase is Phase.ROLE:
            if token == CHANNEL:
                self._enter(Phase.NAME if self.header == b"assistant" else Phase.OFF)
            else:
                self._header(token, special, token_bytes)

    def free_channel(self) -> bytes | None:
        """The free channel whose one mask the next token has, or None where it is not known here."""
        if self.phase is not Phase.TEXT or self.owed or self.count >= self.limit:
            return None
        return self.channel

    @property
    def in_header(self) -> bool:
        """Whether the next token's bytes are needed (a channel name or role is being read)."""
        return self.phase is Phase.NAME or self.phase is Phase.ROLE

    def _text(self, token: int) -> None:
        self.count += 1
        lead, tail = self.shapes.lead[token], self.shapes.tail[token]
        if tail == ONLY_CONTINUATION:  # the middle of a character
            self.owed -= lead
        elif lead == self.owed:  # finishes the character owed, then its own
            self.owed = tail
        else:
            self.owed = -1
        if self.owed < 0:  # not UTF-8 as expected: leave it to the grammar
            self.phase = Phase.OFF

    def _enter(self, phase: Phase) -> None:
        self.phase = phase
        self.header.clear()

    def _header(self, token: int, special: bool, token_bytes: bytes | None) -> None:
        if special or token_bytes is None or len(self.header) + len(token_bytes) > MAX_HEADER:
            self.phase = Phase.OFF
        else:
            self.header += token_bytes
