"""The built-in demo model behind a test server on 127.0.0.1 (the fixtures are in conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from osserve.engine.async_engine import AsyncEngine
from osserve.engine.load import EngineArgs, build_engine
from osserve.server.app import ServerConfig, create_app
from tests.server.serving import serve

MODEL = "osserve-demo"  # the served name the demo tests ask for


@contextmanager
def serving_demo(model_dir: Path, config: ServerConfig | None = None) -> Iterator[str]:
    """The demo model (expanded in `model_dir`) on the CPU behind an app: its base URL."""
    engine = AsyncEngine(build_engine(EngineArgs(model=str(model_dir), device="cpu", max_model_len=1024)))
    try:
        with serve(create_app(engine, engine.tokenizer, config or ServerConfig(model_name=MODEL))) as url:
            yield url
    finally:
        engine.shutdown()
