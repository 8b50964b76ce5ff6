"""SamplingParams: how one request's tokens are chosen and when its generation stops."""

from __future__ import annotations

from dataclasses import dataclass, field

from osserve.errors import InvalidRequestError
from osserve.structured.spec import StructuredOutputs

# Harmony's stop tokens: <|return|> ends a final answer, <|call|> ends a tool call.
RETURN_TOKEN = 200002
CALL_TOKEN = 200012
ENDOFTEXT_TOKEN = 199999
DEFAULT_STOP_TOKEN_IDS = (RETURN_TOKEN, CALL_TOKEN)

MAX_TOP_LOGPROBS = 20


@dataclass
class SamplingParams:
    """Sampling settings of one request (the names and meanings of vLLM's and OpenAI's)."""

    n: int = 1
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 (or 0) means all tokens
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 256  # None: up to the model's context
    min_tokens: int = 0
    ignore_eos: bool = False  # ignore stop token ids (benchmarks run outputs to full length)
    stop_token_ids: list[int] = field(default_factory=lambda: list(DEFAULT_STOP_TOKEN_IDS))
    stop: list[str] = field(default_factory=list)  # stop strings, not included in the output
    logprobs: int | None = None  # None: no logprobs; k: the chosen token's plus top k
    # Test/tool hook: a fixed token sequence the sampler emits instead of sampling (see
    # engine/worker/sampler.py). Used to drive the server's output path with scripted harmony output.
    forced_token_ids: list[int] | None = None
    # The output's constraint (a JSON schema, a tool call, ...): osserve/structured/.
    structured: StructuredOutputs | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Some penalty reads the tokens so far (repetition, frequency or presence)."""
        return self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise InvalidRequestError naming the field for any nonsense value."""

        def bad(fld: str, why: str) -> None:
            raise InvalidRequestError(f"'{fld}' {why}", param=fld)

        if not isinstance(self.n, int) or self.n < 1:
            bad("n", f"must be an integer >= 1, got {self.n!r}")
        if self.n > 128:
            bad("n", f"must be <= 128, got {self.n}")
        if not self.temperature >= 0.0 or self.temperature > 100.0:
            bad("temperature", f"must be in [0, 100], got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            bad("top_p", f"must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            bad("top_k", f"must be -1 (disabled) or a non-negative integer, got {self.top_k!r}")
        if not 0.0 <= self.min_p <= 1.0:
            bad("min_p", f"must be in [0, 1], got {self.min_p!r}")
        if not self.repetition_penalty > 0.0:
            bad("repetition_penalty", f"must be > 0, got {self.repetition_penalty!r}")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            bad("frequency_penalty", f"must be in [-2, 2], got {self.frequency_penalty!r}")
        if not -2.0 <= self.presence_penalty <= 2.0:
            bad("presence_penalty", f"must be in [-2, 2], got {self.presence_penalty!r}")
        if self.max_tokens is not None and (
            not isinstance(self.max_tokens, int) or self.max_tokens < 1
        ):
            bad("max_tokens", f"must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            bad("min_tokens", f"must be an integer >= 0, got {self.min_tokens!r}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            bad("min_tokens", f"({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            bad("logprobs", f"must be in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            bad("stop", "must be a list of non-empty strings")
        if len(self.stop) > 16:
            bad("stop", "may hold at most 16 strings")
        if vocab_size is not None:
            for t in self.stop_token_ids:
                if not 0 <= t < vocab_size:
                    bad("stop_token_ids", f"token id {t} is outside the vocabulary [0, {vocab_size})")
