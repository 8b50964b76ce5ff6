#!/usr/bin/env bash
# Sets everything up and runs the main job: the server on the built-in model, on
# http://127.0.0.1:8000 (pass any `osserve serve` flags through, e.g. --model DIR --port 9000).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/osserve serve --showcase "$@"
