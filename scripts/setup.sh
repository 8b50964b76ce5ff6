#!/usr/bin/env bash
# Creates .venv at the repository root and installs osserve with its test extras into it.
# Without a GPU it installs the CPU build of PyTorch (never the multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# The python tool's sandbox uses util-linux (unshare, setpriv, pivot_root) and mount: part of every
# Debian base system; installed here only where missing and where we may (root with apt-get).
if ! command -v unshare >/dev/null || ! command -v setpriv >/dev/null || ! command -v mount >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get install -y -q util-linux mount >/dev/null 2>&1 || echo "note: could not install util-linux" >&2
    fi
fi
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
