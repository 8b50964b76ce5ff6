#!/usr/bin/env bash
# Sets everything up and runs the whole CPU test suite (Triton kernels under TRITON_INTERPRET=1).
# With arguments, one pytest run with them (e.g. a folder, -k). Without, the suite in a few pytest
# processes, one after another: in one process its memory grew past 13 GB (engines and compiled
# kernels that each test leaves to the garbage collector), more than a 24 GB machine spares.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TRITON_INTERPRET=1

run() {
    set +e
    .venv/bin/python -m pytest -q "$@"
    local rc=$?
    set -e
    # pytest exits 5 when it collected no test: that is a failure for us, not a pass.
    if [ "$rc" -eq 5 ]; then echo "no tests were collected: $*" >&2; return 1; fi
    return "$rc"
}

if [ "$#" -gt 0 ]; then
    run "$@"
    exit $?
fi
groups=("tests/ops tests/gpu tests/model" "tests/engine tests/speculative tests/distributed tests/structured"
        "tests/server")
rest=()
for path in tests/*; do
    case " ${groups[*]} " in *" $path "*) continue ;; esac
    case "$path" in tests/__pycache__|tests/conftest.py|tests/__init__.py) continue ;; esac
    rest+=("$path")
done
failed=0
for group in "${groups[@]}" "${rest[*]}"; do
    echo "== pytest $group"
    # shellcheck disable=SC2086  # each group is a list of paths
    run $group || failed=1
done
exit "$failed"
