"""Shared fixtures: the `tiny` checkpoint is written once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from osserve.config import preset
    from osserve.model.checkpoint import write_checkpoint

    return write_checkpoint(
        preset("tiny"), tmp_path_factory.mktemp("tiny"), seed=0, show_progress=False
    )
