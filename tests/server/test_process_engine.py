"""The server with the engine in its own process (`--engine-process`): same answers as in-process,
errors still typed (400 before anything streams), disconnects abort, and an engine that cannot
start says why."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from openai import BadRequestError, OpenAI

from osserve.demo.compact import expand_compact
from osserve.demo.weights import DEMO_WEIGHTS
from osserve.engine.load import EngineArgs
from osserve.engine.process_engine import ProcessEngine
from osserve.server.app import ServerConfig, create_app
from tests.server.serving import serve

MODEL = "demo"


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessEngine]:
    model_dir = expand_compact(DEMO_WEIGHTS, tmp_path_factory.mktemp("demo"))
    eng = ProcessEngine.start(EngineArgs(model=str(model_dir), device="cpu", max_model_len=1024))
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def base(engine: ProcessEngine) -> Iterator[str]:
    with serve(create_app(engine, engine.tokenizer, ServerConfig(model_name=MODEL))) as url:
        yield url


def test_answers_stream_and_usage(base: str) -> None:
    c = OpenAI(base_url=base + "/v1", api_key="x")
    msgs = [{"role": "user", "content": "What is 21 + 34?"}]
    r = c.chat.completions.create(model=MODEL, messages=msgs, temperature=0)  # type: ignore[arg-type]
    assert r.choices[0].message.content == "21 + 34 = 55." and r.usage and r.usage.completion_tokens > 10
    chunks = list(c.chat.completions.create(model=MODEL, messages=msgs, temperature=0, stream=True))  # type: ignore[arg-type]
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "21 + 34 = 55."


def test_a_schema_bound_answer_streams_whole(base: str) -> None:
    """A schema-bound answer through the engine's process: streamed, the same valid JSON as whole,
    its reasoning too."""
    c = OpenAI(base_url=base + "/v1", api_key="x")
    msgs = [{"role": "user", "content": "What is 37 + 45?"}]
    fmt = {"type": "json_schema", "json_schema": {"name": "sum", "strict": True, "schema": {
        "type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
        "additionalProperties": False}}}
    kw = {"model": MODEL, "messages": msgs, "temperature": 0, "response_format": fmt, "max_tokens": 200}
    whole = c.chat.completions.create(**kw)  # type: ignore[call-overload]
    chunks = list(c.chat.completions.create(**kw, stream=True))  # type: ignore[call-overload]
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    reasoning = "".join(getattr(ch.choices[0].delta, "reasoning_content", None) or "" for ch in chunks if ch.choices)
    assert set(json.loads(content)) == {"answer"} and content == whole.choices[0].message.content
    assert reasoning and reasoning == getattr(whole.choices[0].message, "reasoning_content", None)


def test_bad_input_is_a_400_and_the_engine_lives_on(base: str, engine: ProcessEngine) -> None:
    c = OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
    with pytest.raises(BadRequestError) as e:
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5000)
    assert "context length" in str(e.value)
    with pytest.raises(BadRequestError):  # rejected inside the engine process, typed all the same
        c.completions.create(model=MODEL, prompt=[[10**7]], max_tokens=4)
    r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], temperature=0)
    assert r.choices[0].message.content and engine.is_ready


def test_disconnect_aborts_and_frees_the_engine(base: str, engine: ProcessEngine) -> None:
    body = {"model": MODEL, "prompt": "count", "max_tokens": 900, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=60) as r:
        for _ in r.iter_lines():
            break  # one chunk, then hang up
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (engine.stats().num_running or engine.stats().num_waiting):
        time.sleep(0.1)
    assert engine.stats().num_running == 0 and engine.stats().num_waiting == 0


def test_an_engine_that_cannot_start_says_why(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="failed to start"):
        ProcessEngine.start(EngineArgs(model=str(tmp_path), device="cpu"))  # no checkpoint there


def test_a_killed_engine_fails_open_requests_instead_of_hanging(tmp_path: Path) -> None:
    import asyncio

    from osserve.engine.core.sampling_params import SamplingParams

    eng = ProcessEngine.start(EngineArgs(model=str(expand_compact(DEMO_WEIGHTS, tmp_path)), device="cpu",
                                   max_model_len=1024))

    async def run() -> list:  # type: ignore[type-arg]
        got = []
        params = SamplingParams(max_tokens=900, ignore_eos=True, temperature=0)
        async for d in eng.generate([200006, 1000, 2000], params, "doomed"):
            got.append(d)
            if len(got) == 2:
                eng._process.process.kill()  # type: ignore[union-attr]  # the engine process dies mid-request
        return got

    deltas = asyncio.run(asyncio.wait_for(run(), timeout=60))
    assert deltas[-1].finished and deltas[-1].finish_reason == "error" and deltas[-1].error
    assert not eng.is_ready
    eng.shutdown()


def _lockstep_engine_main(args: EngineArgs, links) -> None:  # type: ignore[no-untyped-def]
    """A model-free engine child: once `args.max_num_seqs` requests are in, every step sends one
    token to each of them in a single message (token = 1000 * request number + step)."""
    from osserve.engine.core.outputs import CompletionDelta, EngineStats

    links.announce(("ready", {"max_model_len": 1024, "max_waiting": 100}))
    running: dict[str, int] = {}
    while len(running) < (args.max_num_seqs or 1):
        for msg in links.receive(1.0):
            running[msg[1]] = int(msg[1].removeprefix("r"))
    for step in range(3):
        links.send([CompletionDelta(rid, [1000 * n + step], "x", None, step == 2, "length" if step == 2 else None,
                                    None, 3, 0, step + 1) for rid, n in running.items()], EngineStats())
    while links.receive(1.0) != [("stop",)]:  # the "stop" at shutdown
        pass


def test_one_step_message_reaches_every_request_in_order() -> None:
    """A step's deltas for many requests arrive as one message: each request gets exactly its own
    tokens, in order, and finishes (the reader hands a whole step to the event loop at once)."""
    import asyncio

    from osserve.engine.core.sampling_params import SamplingParams

    eng = ProcessEngine.start(EngineArgs(max_num_seqs=20), engine_main=_lockstep_engine_main)

    async def one(n: int) -> list[int]:
        tokens = []
        async for d in eng.generate([1, 2, 3], SamplingParams(max_tokens=3), f"r{n}"):
            tokens += d.new_token_ids
            if d.finished:
                assert d.finish_reason == "length"
        return tokens

    async def run() -> list[list[int]]:
        return await asyncio.gather(*(one(n) for n in range(20)))

    try:
        got = asyncio.run(asyncio.wait_for(run(), timeout=60))
    finally:
        eng.shutdown()
    assert got == [[1000 * n, 1000 * n + 1, 1000 * n + 2] for n in range(20)]


def test_outputs_cross_the_pipe_unchanged() -> None:
    """Plain deltas travel as tuples, the rest as objects: what the server reads back is equal."""
    from multiprocessing.reduction import ForkingPickler

    from osserve.engine.core.outputs import CompletionDelta, TokenLogprob, error_delta
    from osserve.engine.process_engine import _Rejected, pack_outputs, unpack_output

    def delta(**kw: object) -> CompletionDelta:
        base: dict[str, object] = dict(request_id="r1", new_token_ids=[5, 6], new_text="ab", new_logprobs=None,
                                       finished=False, finish_reason=None, stop_reason=None, num_prompt_tokens=7,
                                       num_cached_tokens=3, num_output_tokens=2)
        return CompletionDelta(**{**base, **kw})  # type: ignore[arg-type]

    items = [delta(), delta(request_id="r2", new_token_ids=[], new_text=""),
             delta(finished=True, finish_reason="stop", stop_reason=200002, queue_time=0.25),
             delta(new_logprobs=[TokenLogprob(5, -0.1, [(5, -0.1)])]), error_delta("r3", "boom"),
             _Rejected("r4", "ContextLengthError", "too long", "max_tokens")]
    packed = pack_outputs(items)  # type: ignore[arg-type]
    assert [type(p) for p in packed[:2]] == [tuple, tuple] and packed[2:] == items[2:]
    assert [unpack_output(p) for p in ForkingPickler.loads(ForkingPickler.dumps(packed))] == items
