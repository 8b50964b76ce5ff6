"""`osserve serve ORG/NAME` from a Hugging Face cache laid out by the test (HF_HUB_OFFLINE=1): the
parser, the resolver and the app serve the tiny checkpoint under that id; `generate`, `bench
latency` and the offline `LLM` load it too; an unknown id ends in one line on stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from osserve import LLM, SamplingParams, cli
from osserve.engine.async_engine import build_async_engine
from osserve.server.app import ServerConfig, create_app
from osserve.server.run import served_model
from tests.model.hub_cache import COMMIT, lay_out_hub_cache, use_hub_cache

REPO = "acme/gpt-oss-tiny"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def snapshot(tmp_path: Path, tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return lay_out_hub_cache(use_hub_cache(monkeypatch, tmp_path / "hf"), REPO, tiny_checkpoint)


@pytest.fixture
def client(snapshot: Path) -> Iterator[TestClient]:
    args = cli.parse_args(["serve", REPO, "--device", "cpu", "--max-model-len", "256", "--kv-cache-gb", "0.05"])
    name, card = served_model(args)
    assert name == REPO and Path(args.model) == snapshot  # the engine gets the snapshot folder
    engine = build_async_engine(args)
    try:
        with TestClient(create_app(engine, engine.tokenizer, ServerConfig(model_name=name, model_card=card))) as c:
            yield c
    finally:
        engine.shutdown()


def test_serve_by_id_serves_it_under_that_id(client: TestClient) -> None:
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == [REPO]
    r = client.post("/v1/chat/completions", json={"model": REPO, "max_tokens": 3, "temperature": 0,
                                                  "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200 and r.json()["model"] == REPO and r.json()["usage"]["completion_tokens"] == 3
    assert client.post("/v1/chat/completions", json={"model": "gpt-oss-tiny", "max_tokens": 1, "messages": [
        {"role": "user", "content": "hi"}]}).status_code == 404
    tags = client.get("/api/tags").json()["models"][0]
    assert tags["name"] == REPO and tags["details"]["parameter_size"] == "53.7M" and tags["size"] == 105013632


def test_served_model_name_overrides_the_id(snapshot: Path) -> None:
    args = cli.parse_args(["serve", REPO, "--served-model-name", "gpt-oss:20b", "--device", "cpu"])
    assert served_model(args)[0] == "gpt-oss:20b" and Path(args.model) == snapshot
    args = cli.parse_args(["serve", f"{REPO}@{COMMIT}", "--device", "cpu"])
    assert served_model(args)[0] == REPO


def test_generate_bench_and_llm_load_the_id(snapshot: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    small = ["--device", "cpu", "--max-model-len", "256", "--kv-cache-gb", "0.05"]
    assert cli.main(["generate", REPO, "--prompt", "hi", "--max-tokens", "2", *small]) == 0
    assert "2 generated" in capsys.readouterr().out
    out = tmp_path / "latency.json"
    assert cli.main(["bench", "latency", "--model", REPO, "--batch-size", "1", "--input-len", "8", "--output-len",
                     "2", "--warmup", "0", "--repeats", "1", "--output-json", str(out), *small]) == 0
    assert out.is_file() and json.loads(out.read_text())
    llm = LLM(model=REPO, device="cpu", max_model_len=256, kv_cache_gb=0.05)
    assert len(llm.generate("hi", SamplingParams(max_tokens=2, temperature=0))[0].token_ids) == 2


def test_a_folder_that_is_no_checkpoint_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["generate", str(tmp_path), "--prompt", "hi", "--device", "cpu"]) == 1
    assert capsys.readouterr().err == (f"osserve: error: {tmp_path}: not a gpt-oss checkpoint (no config.json); "
                                       "pass a folder with config.json and its safetensors, or a Hugging Face id "
                                       "such as openai/gpt-oss-20b\n")


def test_unknown_id_fails_cleanly(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env |= {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "osserve.cli", "serve", "nobody/nothing", "--device", "cpu"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert lines[0].startswith("osserve: error: nobody/nothing: it is not in the Hugging Face cache")
    assert str(tmp_path / "hf" / "hub") in lines[0] and "HF_HUB_OFFLINE" in lines[0]
