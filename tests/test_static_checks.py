"""ruff and mypy are part of the suite, so a lint or type error fails CI like any other test."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("tool", ["ruff", "mypy"])
def test_static_check(tool: str) -> None:
    args = {"ruff": ["-m", "ruff", "check", "osserve", "tests", "benchmarks"],
            "mypy": ["-m", "mypy", "osserve"]}[tool]
    if shutil.which(tool) is None and subprocess.run([sys.executable, "-m", tool, "--version"],
                                                     capture_output=True).returncode != 0:
        pytest.fail(f"{tool} is not installed: run scripts/setup.sh")
    result = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
