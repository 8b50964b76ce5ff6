"""Resolving MODEL (model/resolve.py): a Hugging Face id from a cache laid out by the test, offline;
its revision forms; the one-line errors for an id neither cached nor reachable, a partial
snapshot, a folder that is not a gpt-oss checkpoint; what a download asks for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub.errors import LocalEntryNotFoundError
from huggingface_hub.utils import filter_repo_objects

from osserve.errors import ConfigError
from osserve.model import resolve
from osserve.model.resolve import HUB_FILES, HUB_SKIP, hub_cache_dir, resolve_model
from tests.model.hub_cache import COMMIT, lay_out_hub_cache, use_hub_cache

REPO = "acme/gpt-oss-tiny"


@pytest.fixture
def hub(tmp_path: Path, tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    hub = use_hub_cache(monkeypatch, tmp_path / "hf")
    lay_out_hub_cache(hub, REPO, tiny_checkpoint)

    def no_network(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("offline: nothing may be downloaded")

    monkeypatch.setattr(resolve, "_download", no_network)
    return hub


def test_id_resolves_from_the_cache_offline(hub: Path) -> None:
    r = resolve_model(REPO)
    assert r.path == hub / f"models--acme--gpt-oss-tiny/snapshots/{COMMIT}"
    assert (r.name, r.source, r.commit) == (REPO, "hub cache", COMMIT)
    assert resolve_model(f"{REPO}@{COMMIT}").path == r.path
    assert resolve_model(REPO, revision="main").path == r.path


def test_unknown_id_or_revision_offline_says_where_it_looked(hub: Path) -> None:
    with pytest.raises(ConfigError) as e:
        resolve_model("nobody/nothing")
    msg = e.value.message
    assert "\n" not in msg and msg.startswith("nobody/nothing: it is not in the Hugging Face cache")
    assert str(hub) in msg and "HF_HUB_OFFLINE is set" in msg and "hf download nobody/nothing" in msg
    with pytest.raises(ConfigError, match="not in the Hugging Face cache"):
        resolve_model(f"{REPO}@v9")  # no such ref cached
    with pytest.raises(ConfigError, match="names revision 'v1' but --revision is 'v2'"):
        resolve_model(f"{REPO}@v1", revision="v2")


def test_partial_snapshot_offline_names_what_is_missing(hub: Path) -> None:
    snapshot = resolve_model(REPO).path
    shard = next(snapshot.glob("model-*.safetensors"))
    shard.unlink()
    with pytest.raises(ConfigError) as e:
        resolve_model(REPO)
    assert "holds only part of it" in e.value.message and shard.name in e.value.message


def test_a_folder_must_be_a_gpt_oss_checkpoint(tmp_path: Path, tiny_checkpoint: Path) -> None:
    assert resolve_model(str(tiny_checkpoint)).source == "folder"
    assert resolve_model(str(tiny_checkpoint)).name == tiny_checkpoint.name
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"empty: not a gpt-oss checkpoint \(no config.json\)"):
        resolve_model(str(empty))
    llama = tmp_path / "llama"
    llama.mkdir()
    for f in tiny_checkpoint.iterdir():  # linked, not copied (105 MB)
        (llama / f.name).symlink_to(f)
    (llama / "config.json").unlink()
    config = json.loads((tiny_checkpoint / "config.json").read_text())
    (llama / "config.json").write_text(json.dumps(config | {"model_type": "llama"}))
    with pytest.raises(ConfigError, match="not a gpt-oss checkpoint .*'model_type' is 'llama'"):
        resolve_model(str(llama))
    (llama / "config.json").write_text(json.dumps(config))
    next(llama.glob("model-*.safetensors")).unlink()
    with pytest.raises(ConfigError, match="not a gpt-oss checkpoint .*missing"):
        resolve_model(str(llama))
    for spec in ("./no/such/dir", str(tmp_path / "missing"), "not-an-id", "a/b/c"):
        with pytest.raises(ConfigError, match="no such folder, and not a Hugging Face id"):
            resolve_model(spec)


def test_online_a_missing_id_is_downloaded_with_only_the_model_files(
        tmp_path: Path, tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hub = use_hub_cache(monkeypatch, tmp_path / "hf", offline=False)
    asked: list[dict[str, Any]] = []

    def fake_snapshot_download(repo_id: str, **kwargs: Any) -> str:
        if kwargs.get("local_files_only"):
            raise LocalEntryNotFoundError("not cached")
        asked.append(kwargs)
        if repo_id == "acme/unreachable":
            raise LocalEntryNotFoundError("Got: ConnectError: [Errno -2] Name or service not known")
        return str(lay_out_hub_cache(Path(kwargs["cache_dir"]), repo_id, tiny_checkpoint))

    monkeypatch.setattr("huggingface_hub.snapshot_download", fake_snapshot_download)
    r = resolve_model("acme/fresh")
    assert (r.source, r.name) == ("hub download", "acme/fresh") and r.path.is_relative_to(hub)
    assert asked[0]["allow_patterns"] == HUB_FILES and asked[0]["ignore_patterns"] == HUB_SKIP
    with pytest.raises(ConfigError, match=r"acme/unreachable: not in the Hugging Face cache .*downloading it "
                                          r"failed \(.*ConnectError"):
        resolve_model("acme/unreachable")


def test_hub_patterns_take_the_served_files_of_gpt_oss_20b() -> None:
    repo_files = [".gitattributes", "LICENSE", "README.md", "USAGE_POLICY", "chat_template.jinja", "config.json",
                  "generation_config.json", "metal/model.bin", "model-00000-of-00002.safetensors",
                  "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                  "model.safetensors.index.json", "original/config.json", "original/dtypes.json",
                  "original/model.safetensors", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
    taken = set(filter_repo_objects(repo_files, allow_patterns=HUB_FILES, ignore_patterns=HUB_SKIP))
    assert taken == {"config.json", "generation_config.json", "model.safetensors.index.json",
                     "model-00000-of-00002.safetensors", "model-00001-of-00002.safetensors",
                     "model-00002-of-00002.safetensors"}


def test_hub_cache_dir_follows_huggingface_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    use_hub_cache(monkeypatch, tmp_path / "home")
    assert hub_cache_dir() == tmp_path / "home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    assert hub_cache_dir() == tmp_path / "cache"
    assert hub_cache_dir(str(tmp_path / "dl")) == tmp_path / "dl"
