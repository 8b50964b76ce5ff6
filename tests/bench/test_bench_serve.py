"""`osserve bench serve` against the tiny-model server and against fake servers."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from osserve.bench.loadgen import LoadConfig, run_load
from osserve.bench.processes import auto_workers, run_load_in_processes, shares
from osserve.bench.serve import main as bench_main
from osserve.bench.stats import RequestRecord, summarize
from osserve.server.app import ServerConfig, create_app
from osserve.tokenizer import load_tokenizer
from tests.server.serving import serve
from tests.server.stub_engine import ScriptedEngine


@pytest.fixture(scope="module")
def stub_url() -> Iterator[str]:
    tok = load_tokenizer().encoding
    script = tok.encode("<|channel|>analysis<|message|>hmm<|end|><|start|>assistant<|channel|>final"
                        "<|message|>one two three four<|return|>", allowed_special="all")
    engine = ScriptedEngine(script, delay=0.002)
    with serve(create_app(engine, load_tokenizer(), ServerConfig(model_name="m"))) as url:
        yield url


def test_percentiles_match_a_hand_computation() -> None:
    recs = [RequestRecord(start=0, ttft=t, itl=[0.01, 0.03], latency=1.0, prompt_tokens=10, output_tokens=n)
            for t, n in [(0.1, 11), (0.2, 11), (0.3, 21), (0.4, 21)]]
    recs.append(RequestRecord(start=0, error="HTTP 400: bad"))
    s = summarize(recs, duration=2.0)
    assert s["completed"] == 4 and s["failed"] == 1 and s["errors"] == ["HTTP 400: bad"]
    assert s["output_throughput"] == 64 / 2.0 and s["request_throughput"] == 2.0
    assert s["total_token_throughput"] == (40 + 64) / 2.0
    # TTFT p50 of 100,200,300,400 ms with linear interpolation: 250; p90: 370; p99: 397.
    assert s["ttft_ms"]["p50"] == pytest.approx(250) and s["ttft_ms"]["p90"] == pytest.approx(370)
    assert s["ttft_ms"]["p99"] == pytest.approx(397)
    # TPOT: (1-0.1)/10=90, (1-0.2)/10=80, (1-0.3)/20=35, (1-0.4)/20=30 ms → mean 58.75
    assert s["tpot_ms"]["mean"] == pytest.approx(58.75)
    assert s["itl_ms"]["p50"] == pytest.approx(np.percentile([10, 30] * 4, 50))


@pytest.mark.parametrize("endpoint", ["chat", "completions", "responses"])
def test_counts_and_usage_on_every_endpoint(stub_url: str, endpoint: str) -> None:
    cfg = LoadConfig(base_url=stub_url, model="m", endpoint=endpoint, num_requests=12, concurrency=4,
                     max_tokens=100, timeout=60)
    records, duration = asyncio.run(run_load(cfg))
    s = summarize(records, duration)
    assert s["completed"] == 12 and s["failed"] == 0
    n = len(load_tokenizer().encoding.encode(
        "<|channel|>analysis<|message|>hmm<|end|><|start|>assistant<|channel|>final"
        "<|message|>one two three four<|return|>", allowed_special="all"))
    assert all(r.output_tokens == n for r in records)  # from the server's usage
    assert all(r.ttft is not None and r.itl for r in records)


def test_first_event_is_the_first_token_not_the_first_text(stub_url: str) -> None:
    """The chat stream's role chunk leaves once the first token is sampled; the script's first three
    tokens are a harmony header (no text), so every request's first event comes before its TTFT."""
    cfg = LoadConfig(base_url=stub_url, model="m", endpoint="chat", num_requests=6, concurrency=2,
                     max_tokens=100, timeout=60)
    records, duration = asyncio.run(run_load(cfg))
    assert all(r.first_event is not None and r.ttft is not None and r.first_event < r.ttft for r in records)
    s = summarize(records, duration)
    assert 0 < s["first_event_ms"]["p50"] < s["ttft_ms"]["p50"]


def test_shares_split_requests_concurrency_and_rate() -> None:
    cfg = LoadConfig(base_url="u", model="m", num_requests=10, concurrency=7, request_rate=6.0)
    parts = shares(cfg, 3)
    assert sorted(i for _, idx in parts for i in idx) == list(range(10))
    assert [idx for _, idx in parts] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert [c.concurrency for c, _ in parts] == [3, 2, 2] and all(c.request_rate == 2.0 for c, _ in parts)
    assert [c.num_requests for c, _ in parts] == [4, 3, 3] and len({c.seed for c, _ in parts}) == 3
    assert len(shares(replace(cfg, concurrency=2), 3)) == 2  # no idle worker
    assert auto_workers(1) == 1 and auto_workers(256) >= 1


def test_several_load_processes_give_every_record(stub_url: str) -> None:
    cfg = LoadConfig(base_url=stub_url, model="m", num_requests=11, concurrency=4, max_tokens=100, timeout=60)
    ticks = []
    t0 = time.perf_counter()
    records, duration = run_load_in_processes(cfg, 3, lambda: ticks.append(1))
    s = summarize(records, duration)
    assert s["completed"] == 11 and s["failed"] == 0 and len(ticks) == 11
    single, _ = asyncio.run(run_load(cfg))
    assert [r.output_tokens for r in records] == [r.output_tokens for r in single]
    # Times count from the load's start: every request started within the run, and the first at
    # once (starting the worker processes, ~0.5 s here, is not counted).
    assert all(0 <= r.start <= time.perf_counter() - t0 for r in records)
    assert min(r.start for r in records) < 0.1 and duration < time.perf_counter() - t0


def test_json_and_plot_and_sweep(stub_url: str, tmp_path: Path) -> None:
    out, png = tmp_path / "run.json", tmp_path / "run.png"
    rc = bench_main(["--base-url", stub_url, "--model", "m", "--num-requests", "6", "--concurrency", "2",
                     "--output-json", str(out), "--plot", str(png), "--dataset", "random", "--input-len", "20"])
    assert rc == 0
    data = json.loads(out.read_text())
    assert set(data) == {"config", "runs"} and data["runs"][0]["summary"]["completed"] == 6
    assert set(data["runs"][0]["records"][0]) >= {"start", "ttft", "first_event", "itl", "latency", "output_tokens",
                                                       "error"}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    sweep = tmp_path / "sweep.png"
    assert bench_main(["--base-url", stub_url, "--model", "m", "--num-requests", "4", "--sweep", "1,2",
                       "--plot", str(sweep), "--output-json", str(out)]) == 0
    assert [r["concurrency"] for r in json.loads(out.read_text())["runs"]] == [1, 2]
    assert sweep.read_bytes()[:4] == b"\x89PNG"


def test_errors_are_counted() -> None:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def bad() -> JSONResponse:
        return JSONResponse({"error": {"message": "nope", "type": "invalid_request_error"}}, status_code=400)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"data": []}

    with serve(app) as url:
        records, d = asyncio.run(run_load(LoadConfig(base_url=url, model="m", num_requests=5, concurrency=2)))
    s = summarize(records, d)
    assert s["failed"] == 5 and s["completed"] == 0 and "HTTP 400" in s["errors"][0]


def test_timeout_stops_cleanly() -> None:
    engine = ScriptedEngine(load_tokenizer().encode("word " * 500), delay=0.01)
    with serve(create_app(engine, load_tokenizer(), ServerConfig(model_name="m"))) as url:
        start = time.monotonic()
        records, _ = asyncio.run(run_load(LoadConfig(base_url=url, model="m", num_requests=8, concurrency=2,
                                                     max_tokens=500, timeout=1.0)))
        assert time.monotonic() - start < 10
    assert len(records) == 8 and all(r.error == "timeout" for r in records)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_ctrl_c_writes_what_was_measured(tmp_path: Path, workers: str) -> None:
    engine = ScriptedEngine(load_tokenizer().encode("word " * 300), delay=0.01)
    with serve(create_app(engine, load_tokenizer(), ServerConfig(model_name="m"))) as url:
        out = tmp_path / "r.json"
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        proc = subprocess.Popen([sys.executable, "-m", "osserve.bench.serve", "--base-url", url, "--model", "m",
                                 "--num-requests", "50", "--concurrency", "2", "--max-tokens", "50",
                                 "--workers", workers, "--output-json", str(out)], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        time.sleep(5)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    runs = json.loads(out.read_text())["runs"]
    assert runs and len(runs[0]["records"]) == 50
    assert any(r["error"] is None for r in runs[0]["records"]) and any(r["error"] for r in runs[0]["records"])
