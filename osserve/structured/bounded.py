"""A JSON answer whose strings' maxLength are enforced beside its grammar (length_bounds.py says
which): a second matcher, of the grammar without the bounds, fills the answer's masks, and a
JsonCursor over the answer clears the tokens that would overflow a bound (json_cursor.py). Before
the answer starts (harmony: after `<|channel|>final<|message|>`) the two grammars agree, so the
second matcher is fed nothing until then. matchers.Grammars holds one per such request, and feeds
the second matcher its tokens in the mask thread that fills its next mask, not on the step loop
(py-spy of the loop on an H100 host: ~0.6 ms a step at ~128 answer rows, 2026-11-26)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from osserve.structured.grammar import BoundedAnswer
from osserve.structured.json_cursor import JsonCursor, TokenRuns, vocabulary_runs
from osserve.structured.vocabulary import token_bytes
from osserve.tokenizer import CHANNEL, MESSAGE

if TYPE_CHECKING:
    from llguidance import LLMatcher


@dataclass
class Bounded:
    """A request whose answer's string bounds are enforced beside its grammar (module docstring).
    Until its answer starts the two grammars agree, so the fast matcher is fed the tokens before it
    only then, in one call; once the answer is complete the request needs it no more. `pending` holds
    the tokens it has yet to see: Grammars takes them when the fast matcher next fills a mask."""

    fast: LLMatcher  # of the grammar without the bounds
    answer: BoundedAnswer
    cursor: JsonCursor | None = None  # over the answer, from its first byte
    pending: list[int] = field(default_factory=list)  # tokens the fast matcher has yet to see
    runs: TokenRuns = field(default_factory=vocabulary_runs, repr=False)  # the vocabulary's, for the cursor

    def feed(self, token: int) -> None:
        """Advance the cursor past an accepted token (the fast matcher sees it later, from `pending`)."""
        self.pending.append(token)
        if self.cursor is not None:
            self.cursor.feed_token(token, self.runs)
        elif token == MESSAGE and self._channel() == b"final":  # the answer's first byte comes next
            self.cursor = JsonCursor(self.answer.bounds)

    def _channel(self) -> bytes | None:
        """The header just closed by the <|message|> last fed: its bytes after its <|channel|> (None:
        no channel named since the last <|message|>). Read back at each <|message|> only."""
        pending = self.pending
        for i in range(len(pending) - 2, -1, -1):
            if pending[i] == CHANNEL:
                return b"".join(token_bytes()[t] for t in pending[i + 1:-1])
            if pending[i] == MESSAGE:
                return None
        return None

    @property
    def fills(self) -> bool:
        """Whether the fast matcher fills the next mask: inside the answer, not inside an escape."""
        return self.cursor is not None and not self.cursor.escape

    def position_key(self) -> bytes | None:
        """Where the fast matcher's next mask is one shared by position (JsonCursor.position_key),
        its key; None: the fast matcher fills it, or the bounded grammar does."""
        return self.cursor.position_key() if self.fills and self.cursor is not None else None

    @property
    def done(self) -> bool:
        return self.cursor is not None and self.cursor.ended
