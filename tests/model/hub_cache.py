"""A Hugging Face cache laid out by hand, as huggingface_hub writes one: `hub/models--ORG--NAME/`
with `blobs/` (the files), `snapshots/COMMIT/` (links to them) and `refs/main` (the commit)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def lay_out_hub_cache(hub: Path, repo: str, checkpoint: Path, commit: str = COMMIT) -> Path:
    """The snapshot folder of `repo` at `commit` holding `checkpoint`'s files (linked, not copied:
    the tiny checkpoint is 105 MB)."""
    org, name = repo.split("/")
    root = hub / f"models--{org}--{name}"
    snapshot = root / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (root / "blobs").mkdir()
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(commit)
    for i, f in enumerate(sorted(checkpoint.iterdir())):
        blob = root / "blobs" / f"{i:064x}"  # named by the file's hash in a real cache
        blob.symlink_to(f)
        (snapshot / f.name).symlink_to(os.path.relpath(blob, snapshot))
    return snapshot


def use_hub_cache(monkeypatch: pytest.MonkeyPatch, hf_home: Path, offline: bool = True) -> Path:
    """Point this test (only) at `hf_home`: HF_HOME set, the other cache variables unset; offline."""
    monkeypatch.setenv("HF_HOME", str(hf_home))
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    return hf_home / "hub"
