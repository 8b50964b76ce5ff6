"""Where the weights come from. `osserve serve MODEL` (and `generate`, `bench latency`,
`LLM(model=...)`) takes what `vllm serve` takes: a checkpoint folder, or a Hugging Face id
`ORG/NAME[@REVISION]`.

An id is looked up in the local Hugging Face cache first, without the network (a server that
restarts does not ask the Hub each time), then downloaded through `huggingface_hub` when the
network allows and HF_HUB_OFFLINE is not set: only the files osserve reads. Whatever the source,
the folder must be a gpt-oss checkpoint. Every failure is one `ConfigError` line that says where
osserve looked and what to do; nothing else is ever fetched in its place."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from osserve.config import ModelConfig
from osserve.errors import ConfigError, OsserveError

# The files osserve reads, top level only (HUB_SKIP): openai/gpt-oss-20b also holds original/
# (the same weights in another layout, 13 GB) and metal/, which `*.safetensors` alone would match.
HUB_FILES = ["config.json", "generation_config.json", "model.safetensors.index.json", "*.safetensors"]
HUB_SKIP = ["*/*"]
FIX = ("download it where the network reaches huggingface.co (`hf download {repo} --exclude 'original/*' "
       "'metal/*'`), point HF_HUB_CACHE or HF_HOME at a cache that holds it, or pass the checkpoint folder")

Source = Literal["folder", "hub cache", "hub download"]


@dataclass(frozen=True)
class ResolvedModel:
    path: Path  # a folder with config.json and the safetensors
    name: str  # the served model name it gives by default: the id, or the folder's name
    source: Source
    commit: str | None = None  # the Hub commit a snapshot holds


def resolve_model(spec: str, revision: str | None = None, download_dir: str | None = None,
                  check: Callable[[Path], None] | None = None) -> ResolvedModel:
    """A folder (checked), or a Hugging Face id from the cache or the Hub. `revision` is vLLM's
    --revision (the same as `@REVISION`); `download_dir` its --download-dir (the Hub cache to use).
    `check`: what the folder must hold (default: a gpt-oss checkpoint; EAGLE3 drafts pass theirs)."""
    check = check or check_checkpoint
    folder = Path(spec).expanduser()
    if folder.is_dir():
        check(folder)
        return ResolvedModel(folder, Path(os.path.abspath(folder)).name, "folder")  # links not followed
    repo, at, tag = spec.partition("@")
    if not _is_hub_id(repo) or (at and not tag):
        raise ConfigError(f"{spec}: no such folder, and not a Hugging Face id (ORG/NAME[@REVISION], "
                               "e.g. openai/gpt-oss-20b)", "model")
    if tag and revision and tag != revision:
        raise ConfigError(f"{spec}: names revision '{tag}' but --revision is '{revision}'", "revision")
    return _from_hub(repo, tag or revision, hub_cache_dir(download_dir), check)


def check_checkpoint(folder: Path) -> None:
    """A gpt-oss checkpoint: config.json of model_type gpt_oss, and every safetensors shard."""
    from osserve.model.weights import checkpoint_files

    if not (folder / "config.json").is_file():
        raise ConfigError(f"{folder}: not a gpt-oss checkpoint (no config.json); pass a folder with "
                               "config.json and its safetensors, or a Hugging Face id such as openai/gpt-oss-20b",
                               "model")
    try:
        ModelConfig.from_pretrained(folder)
        checkpoint_files(folder)
    except OsserveError as e:  # ConfigError from config.json, CheckpointError from the shards
        raise ConfigError(f"{folder}: not a gpt-oss checkpoint ({e.message})", "model") from e


def hub_cache_dir(download_dir: str | None = None) -> Path:
    """The Hugging Face cache, by huggingface_hub's own precedence (HF_HUB_CACHE, then HF_HOME/hub,
    then ~/.cache/huggingface/hub), read now rather than when huggingface_hub was imported, so a
    process that sets HF_HOME later (a test, a notebook) is heard."""
    if download_dir:
        return Path(download_dir).expanduser()
    env = os.environ
    explicit = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(os.path.expandvars(explicit)).expanduser()
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def hub_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE), as huggingface_hub reads it, also when set after
    its import."""
    from huggingface_hub import constants

    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return bool(constants.HF_HUB_OFFLINE) or value.upper() in ("1", "ON", "YES", "TRUE")


def _is_hub_id(repo: str) -> bool:
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if repo.count("/") != 1 or repo.startswith((".", "~")):
        return False
    try:
        validate_repo_id(repo)
    except HFValidationError:
        return False
    return True


def _from_hub(repo: str, revision: str | None, cache: Path, check: Callable[[Path], None]) -> ResolvedModel:
    where = f"the Hugging Face cache ({cache})"
    cached = _cached_snapshot(repo, revision, cache)
    problem = None
    if cached is not None:
        try:
            check(cached)
            return ResolvedModel(cached, repo, "hub cache", cached.name)
        except ConfigError as e:
            problem = e.message
    if hub_offline():
        found = f"{where} holds only part of it ({problem})" if problem else f"it is not in {where}"
        raise ConfigError(f"{repo}: {found}, and HF_HUB_OFFLINE is set, so it was not downloaded; "
                               "unset HF_HUB_OFFLINE, or " + FIX.format(repo=repo), "model")
    path = _download(repo, revision, cache, where)
    check(path)
    return ResolvedModel(path, repo, "hub download", path.name)


def _cached_snapshot(repo: str, revision: str | None, cache: Path) -> Path | None:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo, revision=revision, cache_dir=cache, allow_patterns=HUB_FILES,
                                      ignore_patterns=HUB_SKIP, local_files_only=True))
    except LocalEntryNotFoundError:  # not cached, or cached in part (IncompleteSnapshotError)
        return None


def _download(repo: str, revision: str | None, cache: Path, where: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        return Path(snapshot_download(repo, revision=revision, cache_dir=cache, allow_patterns=HUB_FILES,
                                      ignore_patterns=HUB_SKIP))
    except GatedRepoError as e:
        raise ConfigError(f"{repo}: a gated model; accept its terms on huggingface.co and set HF_TOKEN",
                               "model") from e
    except RepositoryNotFoundError as e:
        raise ConfigError(f"{repo}: no such model on the Hugging Face Hub (a private one needs HF_TOKEN)",
                               "model") from e
    except RevisionNotFoundError as e:
        raise ConfigError(f"{repo}: no revision '{revision}' on the Hugging Face Hub", "revision") from e
    except OSError as e:  # no network, the Hub down, a full disk: huggingface_hub's errors are OSErrors
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"{repo}: not in {where}, and downloading it failed ({reason}); "
                               + FIX.format(repo=repo), "model") from e
