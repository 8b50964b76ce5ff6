"""A tensor-parallel rank that dies takes the engine down cleanly: no hang. Offline, the step in
progress raises EngineDeadError within seconds, and so does every later one. Served, open requests
fail, /health and new requests answer 503, and the server exits with code 1."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from osserve.distributed.parallel_runner import ParallelRunner
from osserve.engine.core.sampling_params import SamplingParams
from osserve.engine.load import EngineArgs, build_engine
from osserve.errors import EngineDeadError
from tests.server.serving import free_port, wait_until_healthy


@pytest.fixture
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.timeout(60)
def test_a_killed_worker_fails_the_engine_at_once(tiny_checkpoint: Path, one_thread: None) -> None:
    engine = build_engine(EngineArgs(model=str(tiny_checkpoint), device="cpu", max_model_len=512,
                                     tensor_parallel_size=2))
    runner = engine.runner
    assert isinstance(runner, ParallelRunner)
    try:
        engine.add_request("r", list(range(100, 200)), SamplingParams(temperature=0, max_tokens=400,
                                                                       ignore_eos=True))
        for _ in range(3):
            engine.step()
        (pid,) = runner.ranks.pool.pids.values()
        os.kill(pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(EngineDeadError, match="rank 1"):
            while engine.has_unfinished():
                engine.step()
        assert time.monotonic() - start < 10
        with pytest.raises(EngineDeadError):  # and every step after it
            engine.step()
    finally:
        runner.shutdown()


@pytest.mark.timeout(120)
def test_the_server_answers_503_and_exits_when_a_worker_dies(tiny_checkpoint: Path) -> None:
    """`osserve serve --tp 2` with the engine in its own process (as on a GPU): a worker killed in
    the middle of a streamed completion."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "osserve.cli", "serve", str(tiny_checkpoint), "--device", "cpu", "--port",
           str(port), "--tensor-parallel-size", "2", "--engine-process", "--max-model-len", "1024"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True).start()  # type: ignore[union-attr]
    try:
        deadline = time.monotonic() + 90  # for the start, and later for the exit
        wait_until_healthy(proc, base, deadline - time.monotonic())
        found = [m for line in lines if (m := re.search(r"worker pids \[(\d+)\]", line))]
        assert found, "".join(lines)
        worker = int(found[0].group(1))
        body = {"model": tiny_checkpoint.name, "prompt": "count", "max_tokens": 900, "ignore_eos": True,
                "stream": True, "temperature": 0}
        events: list[dict] = []
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=30) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    events.append(json.loads(line[6:]))
                    if len(events) == 3:
                        os.kill(worker, signal.SIGKILL)
        assert "error" in events[-1], events[-1]  # the stream ends with an error, not a hang
        statuses = []
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                statuses.append(httpx.get(base + "/health", timeout=1).status_code)
                statuses.append(httpx.post(base + "/v1/completions", json={**body, "stream": False},
                                           timeout=5).status_code)
            except httpx.HTTPError:
                pass  # shutting down: the port closes
            time.sleep(0.1)
        assert proc.wait(timeout=30) == 1, "".join(lines)
        assert statuses and set(statuses) == {503}, statuses
        assert "tensor parallelism: rank 1" in "".join(lines)
    finally:
        proc.kill()
        proc.wait()
