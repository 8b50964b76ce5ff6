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


def pytest_configure(config: pytest.Config) -> None:
    """One torch thread: the suite's tensors are small, and on a 2-core machine shared with the
    test servers' threads, torch's second intra-op thread made small ops hundreds of times slower
    (index_add_ on [8, 128]: 10 µs with one thread, 6 ms with two, 2026-11-25)."""
    import torch

    torch.set_num_threads(1)
