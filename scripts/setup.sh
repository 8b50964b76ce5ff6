#!/usr/bin/env bash
# Creates .venv at the repository root and installs osserve with its test extras into it.
# Without a GPU it installs the CPU build of PyTorch (never the multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
        .venv/bin/python -m pip install -q torch
    else
        .venv/bin/python -m pip install -q torch==2.13.0
    fi
fi
.venv/bin/python -m pip install -q -e ".[test]"
