"""The demo model's fixtures: its weights expanded once per session, and a module's server of the
model without tools (`base`). A module that needs another server config makes its own with
`demo_server.serving_demo`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from osserve.demo.compact import expand_compact
from osserve.demo.weights import DEMO_WEIGHTS
from tests.demo.demo_server import serving_demo


@pytest.fixture(scope="session")
def demo_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return expand_compact(DEMO_WEIGHTS, tmp_path_factory.mktemp("demo"))


@pytest.fixture(scope="module")
def base(demo_model_dir: Path) -> Iterator[str]:
    """The demo model served as `osserve serve` serves it, without tools."""
    with serving_demo(demo_model_dir) as url:
        yield url
