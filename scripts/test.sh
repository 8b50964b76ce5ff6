#!/usr/bin/env bash
# Sets everything up and runs the whole CPU test suite (Triton kernels under TRITON_INTERPRET=1).
# With arguments, one pytest run with them (e.g. a folder, -k). Without, the suite in a few pytest
# processes, since in one its memory grew past 13 GB (engines and compiled kernels that each test
# leaves to the garbage collector), more than a 24 GB machine spares. They run in two lanes at once,
# each lane's one after another: each process computes on one torch thread (tests/conftest.py), so
# on a 2-core machine one after another left a core idle (20.5 minutes with setup, 2026-11-27).
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
# Two lanes of about equal time: the engine's tests, the kernels', the tensor-parallel ranks'; the
# structured outputs', the server's, then the rest. From a fresh clone (2026-11-27), with the lanes
# then "engine, speculative and structured; kernels" and "server; ranks; rest", the groups took
# 12.3, 5.3 and 7.0 (1.6 of it one test, since made concurrent), 2.6, 6.4 minutes: 20.7 in all with
# setup, the first lane last.
lanes=("tests/engine tests/speculative|tests/ops tests/gpu tests/model|tests/distributed"
       "tests/structured|tests/server|REST")
named=" ${lanes[*]//|/ } "
rest=()
for path in tests/*; do
    case "$named" in *" $path "*) continue ;; esac
    case "$path" in tests/__pycache__|tests/conftest.py|tests/__init__.py) continue ;; esac
    rest+=("$path")
done
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
# Before the lanes: the caches that tests share (the tokenizer's file, the built-in model's folders).
.venv/bin/python -c "from osserve.engine.load import builtin_draft_dir, builtin_model_dir
from osserve.tokenizer import load_tokenizer
load_tokenizer(); builtin_model_dir(); builtin_draft_dir()"

run_lane() {  # LANE_INDEX "GROUP|GROUP...": each group a pytest process, one after another
    local failed=0 n=0 group
    local -a groups
    IFS='|' read -r -a groups <<<"$2"
    for group in "${groups[@]}"; do
        [ "$group" = REST ] && group="${rest[*]}"
        n=$((n + 1))
        echo "== pytest $group"
        # shellcheck disable=SC2086  # each group is a list of paths
        run $group --basetemp="$logs/tmp-$1-$n" || failed=1
    done
    return "$failed"
}
failed=0
run_lane 1 "${lanes[1]}" >"$logs/lane-1.log" 2>&1 &
second=$!
run_lane 0 "${lanes[0]}" || failed=1  # its output as it comes: a test that hangs shows where
wait "$second" || failed=1
cat "$logs/lane-1.log"
exit "$failed"
