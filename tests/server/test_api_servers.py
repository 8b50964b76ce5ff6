"""Several HTTP server processes in front of one engine process (`--api-server-count`): requests
spread over them and are answered as by one; /metrics sums every process; a stored response is
found from any; a server that hangs up has its requests aborted; the supervisor stops everything."""

from __future__ import annotations

import multiprocessing as mp
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from osserve.demo.compact import expand_compact
from osserve.demo.weights import DEMO_WEIGHTS
from osserve.engine.core.outputs import error_delta
from osserve.engine.load import EngineArgs
from osserve.engine.process_engine import ServerLinks
from osserve.errors import ConfigError
from osserve.server.api_servers import ApiServers, ServerSpec
from osserve.server.app import ServerConfig
from osserve.server.responses_store import ResponseStore, StoredResponse
from tests.server.serving import free_port, wait_until_healthy

MODEL = "demo"
QUESTION = {"model": MODEL, "messages": [{"role": "user", "content": "What is 21 + 34?"}], "temperature": 0}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiServers, str]]:
    model_dir = expand_compact(DEMO_WEIGHTS, tmp_path_factory.mktemp("demo"))
    port = free_port()
    spec = ServerSpec(ServerConfig(model_name=MODEL), "127.0.0.1", port, log_level="warning")
    with ApiServers(EngineArgs(model=str(model_dir), device="cpu", max_model_len=1024), 2, spec) as running:
        yield running, f"http://127.0.0.1:{port}"


def post(url: str, body: dict[str, object]) -> httpx.Response:
    """On a connection of its own: the kernel picks a server process for each new connection."""
    with httpx.Client(timeout=60) as c:
        return c.post(url, json=body)


def test_requests_spread_over_the_servers_and_metrics_count_them_all(servers: tuple[ApiServers, str]) -> None:
    running, base = servers
    with ThreadPoolExecutor(max_workers=12) as pool:  # at once: the engine batches them (one by one: 106 s)
        answers = list(pool.map(lambda _: post(base + "/v1/chat/completions", QUESTION), range(12)))
    assert [a.status_code for a in answers] == [200] * 12
    assert {a.json()["choices"][0]["message"]["content"] for a in answers} == {"21 + 34 = 55."}
    # Each process writes its own files of observations: both served some of the twelve.
    writers = {f.stem.rsplit("_", 1)[1] for f in (Path(running.shared) / "metrics").glob("histogram_*.db")}
    assert len(writers) == 2
    for _ in range(4):  # whichever process a scrape reaches counts all twelve
        with httpx.Client() as c:
            text = c.get(base + "/metrics").text
        line = next(x for x in text.splitlines() if x.startswith("osserve:request_success_total{"))
        assert float(line.split()[-1]) == 12
        assert "osserve:num_requests_running" in text


def test_a_stored_response_is_found_from_every_server(servers: tuple[ApiServers, str]) -> None:
    _, base = servers
    previous = None
    for turn in range(8):
        body = {"model": MODEL, "input": f"Say {turn}.", "max_output_tokens": 4, "temperature": 0,
                "previous_response_id": previous}
        r = post(base + "/v1/responses", body)
        assert r.status_code == 200, r.text
        previous = r.json()["id"]
        with httpx.Client() as c:
            assert c.get(f"{base}/v1/responses/{previous}").status_code == 200


def test_bad_input_is_a_400_from_a_server_process(servers: tuple[ApiServers, str]) -> None:
    _, base = servers
    r = post(base + "/v1/chat/completions", {**QUESTION, "max_tokens": 5000})
    assert r.status_code == 400 and "context length" in r.json()["error"]["message"]


def test_a_port_in_use_is_refused() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        spec = ServerSpec(ServerConfig(model_name=MODEL), "127.0.0.1", port)
        with pytest.raises(ConfigError, match="in use"):
            ApiServers(EngineArgs(), 2, spec)


def _idle_engine_main(args: EngineArgs, links: ServerLinks) -> None:
    """A model-free engine child that only says it is ready and waits to be stopped."""
    links.announce(("ready", {"max_model_len": 1024, "max_waiting": 100}))
    while ("stop",) not in links.receive(1.0):
        pass


def test_a_server_that_dies_stops_everything() -> None:
    spec = ServerSpec(ServerConfig(model_name=MODEL), "127.0.0.1", free_port(), log_level="warning")
    running = ApiServers(EngineArgs(), 2, spec, engine_main=_idle_engine_main)
    try:
        running.servers[1].kill()
        started = time.monotonic()
        assert running.wait() != 0 and time.monotonic() - started < 10
    finally:
        running.stop()
    assert not any(p.is_alive() for p in [*running.servers, running.engine.process])
    assert not Path(running.shared).exists()


def test_the_engine_answers_each_server_and_aborts_for_one_that_hangs_up() -> None:
    pipes = [(mp.Pipe(duplex=False), mp.Pipe(duplex=False)) for _ in range(2)]  # ((cmd r, cmd w), (out r, out w))
    links = ServerLinks({i: (cmd[0], out[1]) for i, (cmd, out) in enumerate(pipes)})
    (_, to_engine0), (from_engine0, _) = pipes[0]
    (_, to_engine1), (from_engine1, _) = pipes[1]
    to_engine0.send(("add", "a", [1], None))
    to_engine1.send(("add", "b", [1], None))
    assert sorted(m[1] for m in links.receive(1.0)) == ["a", "b"]
    links.send([error_delta("b", "x")], stats=None)  # type: ignore[arg-type]
    assert from_engine0.recv()[1] == [] and from_engine1.recv()[1][0].request_id == "b"
    to_engine0.close()  # server 0 hangs up: its request is aborted, server 1 goes on
    assert links.receive(1.0) == [("abort", "a")]
    to_engine1.close()
    assert links.receive(1.0) == [("stop",)]


def test_the_response_store_evicts_the_least_recently_used_and_is_shared_through_its_file(tmp_path: Path) -> None:
    path = str(tmp_path / "responses.db")
    one, other = ResponseStore(3, path), ResponseStore(3, path)
    for rid in "abc":
        one.put(rid, StoredResponse({"id": rid}))
    assert other.get("a") == StoredResponse({"id": "a"})  # seen from the other; "a" is now the most recent
    other.put("d", StoredResponse({"id": "d"}))
    assert one.get("b") is None and [one.get(r) is not None for r in "acd"] == [True] * 3 and len(one) == 3


def test_a_created_store_is_in_wal_mode_and_opening_it_takes_no_write_lock(tmp_path: Path) -> None:
    """ResponseStore.create switches the file to WAL before the server processes open it: their own
    switch then needs no lock, so it succeeds while another connection holds a write transaction
    (two servers switching a fresh file at once failed with "database is locked")."""
    import sqlite3

    path = str(tmp_path / "responses.db")
    ResponseStore.create(path)
    writer = sqlite3.connect(path, isolation_level=None)
    assert writer.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    writer.execute("BEGIN IMMEDIATE")  # a write transaction held, as another server's put would
    try:
        store = ResponseStore(3, path)  # its WAL switch and CREATE TABLE IF NOT EXISTS
        assert len(store) == 0
    finally:
        writer.execute("ROLLBACK")


def test_the_command_serves_through_two_processes_and_stops_on_sigterm() -> None:
    """`osserve serve --api-server-count 2` on the built-in model: answers, then SIGTERM stops the
    supervisor, its servers and the engine (no process left holding the port)."""
    import signal
    import subprocess
    import sys

    port = free_port()
    cmd = [sys.executable, "-m", "osserve.cli", "serve", "--device", "cpu", "--port", str(port),
           "--api-server-count", "2", "--max-model-len", "1024"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until_healthy(proc, f"http://127.0.0.1:{port}", 120)
        question = {**QUESTION, "model": "osserve-builtin", "max_tokens": 8}
        assert post(f"http://127.0.0.1:{port}/v1/chat/completions", question).status_code == 200
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert "2 HTTP server processes" in out
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
