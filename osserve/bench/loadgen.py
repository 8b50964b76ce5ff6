"""The load generator: many streaming requests against any OpenAI-compatible server.

Every request streams (SSE). TTFT is the first chunk that carries text — reasoning or content,
since gpt-oss reasons first; output tokens come from the server's usage (chat and completions
with `stream_options.include_usage`, the Responses API's `response.completed`).

The first event is also recorded, text or not. osserve's chat stream sends its role chunk once the
request's first token is sampled (the first token may be a harmony header's, which carries no
text), so there it is the time to the first token: what a grammar's compile would delay, apart from
the header tokens a grammar makes a random-weight model write before its text.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from osserve.bench.stats import RequestRecord

WORDS = ("time light energy wave particle field matter space quantum state system measure theory "
         "observe electron photon atom probability function motion force mass charge spin").split()


@dataclass
class LoadConfig:
    base_url: str
    model: str
    endpoint: str = "chat"  # chat | completions | responses
    num_requests: int = 100
    concurrency: int = 8
    request_rate: float | None = None  # requests/s (Poisson arrivals); None: as fast as allowed
    max_tokens: int = 128
    ignore_eos: bool = False
    dataset: str = "fixed"  # fixed | random | sharegpt-like
    prompt: str = "Explain quantum mechanics in one paragraph."
    input_len: int = 128
    seed: int = 0
    timeout: float = 600.0  # the whole run, seconds
    api_key: str | None = None
    json_schema: dict[str, Any] | None = None  # every request's answer follows it (structured outputs)


def load_schema(text: str | None) -> dict[str, Any] | None:
    """--json-schema: JSON text, or the path of a file holding it."""
    if text is None:
        return None
    loaded = json.loads(text if text.lstrip().startswith("{") else Path(text).read_text())
    return loaded if isinstance(loaded, dict) else None


def make_prompts(cfg: LoadConfig) -> list[str]:
    """fixed: the same prompt; random: ~input_len random words; sharegpt-like: a synthetic mix
    whose lengths follow a lognormal (median ~input_len/2, long tail), seeded — no data set is
    downloaded."""
    rng = random.Random(cfg.seed)
    if cfg.dataset == "fixed":
        return [cfg.prompt] * cfg.num_requests
    if cfg.dataset == "random":
        return [" ".join(rng.choice(WORDS) for _ in range(cfg.input_len)) for _ in range(cfg.num_requests)]
    lengths = [max(4, min(4 * cfg.input_len, int(rng.lognormvariate(0, 0.8) * cfg.input_len / 2)))
               for _ in range(cfg.num_requests)]
    return [" ".join(rng.choice(WORDS) for _ in range(n)) for n in lengths]


def request_body(cfg: LoadConfig, prompt: str) -> tuple[str, dict[str, Any]]:
    extra: dict[str, Any] = {"ignore_eos": True} if cfg.ignore_eos else {}
    if cfg.json_schema is not None:
        fmt = {"type": "json_schema", "name": "answer", "schema": cfg.json_schema, "strict": True}
        extra |= {"text": {"format": fmt}} if cfg.endpoint == "responses" else {
            "response_format": {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}}
    if cfg.endpoint == "chat":
        return "/v1/chat/completions", {"model": cfg.model, "messages": [{"role": "user", "content": prompt}],
                                        "max_tokens": cfg.max_tokens, "stream": True,
                                        "stream_options": {"include_usage": True}, **extra}
    if cfg.endpoint == "completions":
        return "/v1/completions", {"model": cfg.model, "prompt": prompt, "max_tokens": cfg.max_tokens,
                                   "stream": True, "stream_options": {"include_usage": True}, **extra}
    return "/v1/responses", {"model": cfg.model, "input": prompt, "max_output_tokens": cfg.max_tokens,
                             "stream": True, **extra}


def _has_text(endpoint: str, event: dict[str, Any]) -> bool:
    if endpoint == "responses":
        return event.get("type") in ("response.output_text.delta", "response.reasoning_text.delta")
    for c in event.get("choices") or []:
        if endpoint == "completions" and c.get("text"):
            return True
        d = c.get("delta") or {}
        if d.get("content") or d.get("reasoning") or d.get("reasoning_content") or d.get("tool_calls"):
            return True
    return False


def _usage(endpoint: str, event: dict[str, Any]) -> tuple[int, int] | None:
    if endpoint == "responses":
        if event.get("type") in ("response.completed", "response.incomplete"):
            u = (event.get("response") or {}).get("usage") or {}
            return u.get("input_tokens", 0), u.get("output_tokens", 0)
        return None
    u = event.get("usage")
    return (u.get("prompt_tokens", 0), u.get("completion_tokens", 0)) if u else None


async def one_request(client: httpx.AsyncClient, cfg: LoadConfig, prompt: str, t0: float) -> RequestRecord:
    path, body = request_body(cfg, prompt)
    rec = RequestRecord(start=time.perf_counter() - t0)
    begin = time.perf_counter()
    last = begin
    try:
        async with client.stream("POST", path, json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                rec.error = f"HTTP {resp.status_code}: {text[:200]}"
                return rec
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    rec.error = f"stream error: {event['error']}"
                    break
                now = time.perf_counter()
                if rec.first_event is None:
                    rec.first_event = now - begin
                if _has_text(cfg.endpoint, event):
                    if rec.ttft is None:
                        rec.ttft = now - begin
                    else:
                        rec.itl.append(now - last)
                    last = now
                    rec.chunk_times.append(now - t0)
                usage = _usage(cfg.endpoint, event)
                if usage:
                    rec.prompt_tokens, rec.output_tokens = usage
        rec.latency = time.perf_counter() - begin
        if rec.error is None and rec.output_tokens == 0 and rec.ttft is None:
            rec.error = "no output and no usage"
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        rec.error = f"{type(e).__name__}: {e}"
    except asyncio.CancelledError:
        rec.error = "timeout"
        raise
    return rec


async def run_load(cfg: LoadConfig, on_done: Callable[[RequestRecord], None] | None = None,
                   prompts: list[str] | None = None, start: Callable[[], float] = time.perf_counter,
                   ) -> tuple[list[RequestRecord], float]:
    """Run the whole load; returns (records in submission order, duration). Stops by itself:
    bounded request count, and cfg.timeout for the whole run (what is still running then is
    cancelled and recorded as a 'timeout' error). prompts: these instead of make_prompts(cfg);
    start: called once the client is ready, returns the time.perf_counter() that the load starts
    at and record times count from (bench/processes.py's waits for every worker and returns the
    parent's start, so that several processes' records share one clock)."""
    prompts = make_prompts(cfg) if prompts is None else prompts
    rng = random.Random(cfg.seed + 1)
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    limits = httpx.Limits(max_connections=cfg.concurrency, max_keepalive_connections=cfg.concurrency)
    records: list[RequestRecord | None] = [None] * len(prompts)
    sem = asyncio.Semaphore(cfg.concurrency)
    async with httpx.AsyncClient(base_url=cfg.base_url, limits=limits, headers=headers,
                                 timeout=httpx.Timeout(cfg.timeout)) as client:
        t0 = start()
        async def worker(i: int, delay: float) -> None:
            await asyncio.sleep(delay)
            async with sem:
                rec = RequestRecord(start=time.perf_counter() - t0, error="timeout")
                try:
                    rec = await one_request(client, cfg, prompts[i], t0)
                finally:
                    records[i] = rec
                    if on_done:
                        on_done(rec)

        delays, at = [], 0.0
        for _ in prompts:
            delays.append(at)
            if cfg.request_rate:
                at += rng.expovariate(cfg.request_rate)
        tasks = [asyncio.create_task(worker(i, d)) for i, d in enumerate(delays)]
        # Ctrl-C ends the run like the timeout does: what finished is kept, the rest cancelled.
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGINT, stop.set)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
            pass
        all_done = asyncio.ensure_future(asyncio.wait(tasks))
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({all_done, stopped}, timeout=cfg.timeout, return_when=asyncio.FIRST_COMPLETED)
        for t in (*tasks, all_done, stopped):
            t.cancel()
        await asyncio.gather(*tasks, all_done, stopped, return_exceptions=True)
        try:
            loop.remove_signal_handler(signal.SIGINT)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
    duration = time.perf_counter() - t0
    return [r or RequestRecord(start=duration, error="timeout") for r in records], duration
