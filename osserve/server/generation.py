"""What every endpoint shares: the app's state, request ids, sampling params from a request,
running one or n generations with latency metrics, and SSE framing."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from osserve.engine.core.outputs import CompletionDelta, EngineClient
from osserve.engine.core.sampling_params import DEFAULT_STOP_TOKEN_IDS, SamplingParams
from osserve.errors import ModelNotFoundError
from osserve.server.metrics import ServerMetrics
from osserve.server.responses_store import ResponseStore
from osserve.structured.grammar import check
from osserve.structured.spec import StructuredOutputs
from osserve.tokenizer import Tokenizer
from osserve.tools.conversations import ToolStates

if TYPE_CHECKING:
    from osserve.tools.registry import ToolServers

T = TypeVar("T")


@dataclass
class ServerState:
    engine: EngineClient
    tokenizer: Tokenizer
    model_name: str
    metrics: ServerMetrics
    responses: ResponseStore
    api_key: str | None = None
    stream_interval: int = 1  # tokens per delta handed on, after the first (vLLM's --stream-interval)
    tools: ToolServers | None = None  # the tools the Responses API runs (--tool-server), started with the app
    tool_states: ToolStates = field(default_factory=ToolStates)  # conversations' live tool state

    def check_model(self, name: str) -> None:
        # Ollama clients send "name:tag"; accept our name with any tag.
        if name != self.model_name and name.split(":")[0] != self.model_name:
            raise ModelNotFoundError(f"the model '{name}' does not exist; this server serves "
                                     f"'{self.model_name}'", "model")


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}" if prefix[-1] != "_" else prefix + secrets.token_hex(12)


def sampling_params(
    *, temperature: float | None, top_p: float | None, max_tokens: int | None, seed: int | None,
    stop: list[str] | None = None, extra: dict[str, Any] | None = None, logprobs: int | None = None,
    stop_token_ids: tuple[int, ...] = DEFAULT_STOP_TOKEN_IDS,
) -> SamplingParams:
    p = SamplingParams(
        temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        max_tokens=max_tokens, seed=seed, stop=list(stop or []), logprobs=logprobs,
        stop_token_ids=list(stop_token_ids),
    )
    for k, v in (extra or {}).items():
        setattr(p, k, v)
    return p


def constrain(params: SamplingParams, spec: StructuredOutputs | None) -> SamplingParams:
    """params with the output constraint, checked here (a bad schema is a 400 before the engine sees
    the request; the engine compiles it off its step loop)."""
    if spec is not None:
        check(spec, params.max_tokens)
        params.structured = spec
    return params


async def generate(
    state: ServerState, prompt: list[int], params: SamplingParams, request_id: str
) -> AsyncIterator[CompletionDelta]:
    """The engine's deltas for one request, recording TTFT / ITL / e2e / queue time. With a
    stream interval N > 1, deltas after the first token are joined until they hold N tokens (or
    the last one comes): fewer, larger chunks for the HTTP side to write."""
    start = time.monotonic()
    first: float | None = None
    last = start
    held: CompletionDelta | None = None
    async for d in state.engine.generate(prompt, params, request_id):
        now = time.monotonic()
        if d.new_token_ids:
            if first is None:
                first = now
            else:
                state.metrics.observe_itl(now - last)
            last = now
        if d.finished:
            state.metrics.observe_request(None if first is None else first - start, now - start,
                                          d.queue_time, d.finish_reason)
        # Held: every delta after the first tokens (an error delta after held tokens, too).
        if state.stream_interval > 1 and (held is not None or d.num_output_tokens > len(d.new_token_ids)):
            held = d if held is None else held.then(d)
            if not d.finished and len(held.new_token_ids) < state.stream_interval:
                continue
            d, held = held, None
        yield d


async def generate_n(
    state: ServerState, prompt: list[int], params: list[SamplingParams], request_id: str
) -> AsyncIterator[tuple[int, CompletionDelta]]:
    """Several choices at once, interleaved as their deltas arrive: (choice index, delta)."""
    if len(params) == 1:
        async for d in generate(state, prompt, params[0], request_id):
            yield 0, d
        return
    queue: asyncio.Queue[tuple[int, CompletionDelta | BaseException]] = asyncio.Queue()

    async def pump(i: int, p: SamplingParams) -> None:
        try:
            async for d in generate(state, prompt, p, f"{request_id}-{i}"):
                await queue.put((i, d))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, which re-raises
            await queue.put((i, e))

    # Validate every choice before starting any (errors must come before the first byte).
    tasks = [asyncio.create_task(pump(i, p)) for i, p in enumerate(params)]
    done = 0
    try:
        while done < len(params):
            i, item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            done += item.finished
            yield i, item
    finally:
        for t in tasks:
            t.cancel()


def choice_params(base: SamplingParams, n: int) -> list[SamplingParams]:
    """n copies; seeded requests get seed, seed+1, ... so choices differ but stay reproducible."""
    from dataclasses import replace

    return [replace(base, seed=None if base.seed is None else base.seed + i,
                    stop=list(base.stop), stop_token_ids=list(base.stop_token_ids)) for i in range(n)]


async def with_first(first: T, rest: AsyncIterator[T]) -> AsyncIterator[T]:
    """The item already pulled (to surface validation errors before any byte), then the rest."""
    yield first
    async for x in rest:
        yield x


def sse(data: dict[str, Any] | str, event: str | None = None) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"
