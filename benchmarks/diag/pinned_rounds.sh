#!/usr/bin/env bash
# Whether the json rounds' slower loop (schedule and build+launch, BENCHMARKS.md "Structured
# outputs") comes from the other processes sharing its cores: structured_ab.sh's 20b server and
# load (c=256, 1,024 chat requests, 256 out), rounds plain and json; then every thread of the engine
# process pinned to the first CPUS_ENGINE CPUs (its hyperthread siblings kept free), the HTTP
# processes, the grammar processes and the load generator to the rest, and the same rounds again. Each round's engine
# windows and the rounds' table printed last.
#   [CPUS_ENGINE=2] [N=1024] [RUNS="plain json"] bash benchmarks/diag/pinned_rounds.sh   (carry .whl)
set -u
N=${N:-1024}; RUNS=${RUNS:-plain json}; CPUS_ENGINE=${CPUS_ENGINE:-2}
source benchmarks/gpu_env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
lscpu | grep -E "^CPU\(s\)|Thread|Core|Socket|Model name" ; echo "siblings of cpu0: $(cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list)"
python3 -c "import json; from benchmarks.bench_structured import SCHEMA; print(json.dumps(SCHEMA))" > /tmp/schema.json
log="$OUT/server-pinned.log"
python3 -m osserve.cli serve --load-format dummy --preset 20b --port 8000 --max-num-seqs 256 --max-model-len 4096 \
    --max-num-batched-tokens 8192 > "$log" 2>&1 &
server=$!
wait_for_server $server "$log"
TABLE=/tmp/pinned.txt; : > "$TABLE"
rounds() {  # $1: a label
    for run in $RUNS; do
        logged=$(wc -l < "$log")
        extra=(); [ "$run" = json ] && extra=(--json-schema /tmp/schema.json)
        result=$(python3 -m osserve.bench.serve --base-url http://127.0.0.1:8000 --model gpt-oss-20b --endpoint chat \
            --num-requests "$N" --concurrency 256 --max-tokens 256 --ignore-eos --timeout 200 \
            --prompt "Explain quantum mechanics in one paragraph." "${extra[@]}")
        tok=$(echo "$result" | grep "output token throughput" | grep -oE "[0-9]+\.[0-9]+" | head -1)
        echo "== $1 $run: $tok tok/s"
        tail -n +"$((logged + 1))" "$log" | grep "engine: " | sed 's/^.* INFO osserve: //' | sed 's/500 steps (.*mean batch/mean batch/'
        printf "| %s | %s | %s |\n" "$1" "$run" "$tok" >> "$TABLE"
    done
}
rounds unpinned
python3 - "$server" "$CPUS_ENGINE" "$$" <<'PY'
import os, sys
from pathlib import Path
root, n, shell = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
cpus = sorted(os.sched_getaffinity(0))
def siblings(c):
    return {int(x) for part in Path(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list").read_text().strip().split(",")
            for x in (range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1))}
engine_cpus = set(cpus[:n])
held = set().union(*(siblings(c) for c in engine_cpus))
rest = set(cpus) - held
def children(pid):
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and Path(f"/proc/{p}/stat").exists()
            and Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1] == str(pid)]
def pin(pid, where):
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(tid), where)
spawned = children(root)
engine = max(spawned, key=lambda p: len(os.listdir(f"/proc/{p}/task")) + 100 * len(children(p)))
pin(engine, engine_cpus)
for p in spawned:
    if p != engine:
        pin(p, rest)  # the HTTP processes
for p in children(engine):
    pin(p, rest)  # the grammar processes
os.sched_setaffinity(shell, rest)  # the load generator, started by this script's shell from now on
print(f"engine {engine} on {sorted(engine_cpus)} (its siblings kept free: {sorted(held - engine_cpus)}), "
      f"the others on {sorted(rest)}")
PY
rounds pinned
kill $server; wait $server 2>/dev/null
echo "| engine | run | out tok/s |"; echo "|---|---|---|"; cat "$TABLE"
