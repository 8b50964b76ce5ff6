#!/usr/bin/env bash
# Sets everything up and runs the main job: the server on the built-in model, on
# http://127.0.0.1:8000, with the built-in tools for the Responses API (--tool-server demo: the
# browser over the shipped documents and the sandboxed python). Pass any `osserve serve` flags
# through, e.g. --model DIR --port 9000.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
tools=(--tool-server demo)
# The python tool runs model-written code in the kernel's namespaces (osserve/tools/python/sandbox.py);
# where they cannot be set up, say why and serve the browser alone rather than not at all.
if ! why=$(echo 'print(1)' | .venv/bin/osserve tools run python 2>&1 >/dev/null); then
    echo "serve.sh: the python tool cannot run on this machine: ${why#osserve: }" >&2
    echo "serve.sh: serving with --tool-server browser (no python); see README, 'Built-in tools and MCP'" >&2
    tools=(--tool-server browser)
fi
exec .venv/bin/osserve serve --showcase "${tools[@]}" "$@"
