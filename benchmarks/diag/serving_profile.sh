#!/usr/bin/env bash
# Where the engine process's step loop spends the host's time under serving load, without and with a
# JSON schema on every request: structured_ab.sh's server and load (20b, c=256, chat, the fixed
# prompt, 256 out, ignore_eos), each round sampled mid-run by py-spy (non-blocking, RATE a second,
# SECONDS_RECORDED seconds, every process of the server), then benchmarks/diag/collapsed_top.py's
# tables of the step loop's functions, one per round, printed last. A round may add py-spy options:
# "json+idle" also samples the loop while it waits (--idle: where it blocks), "json+native" reads
# native frames too (--native; that pauses the process at each sample, so its tok/s are not comparable).
#   [PRESET=20b] [N=1024] [RUNS="plain json"] [RATE=100] [SECONDS_RECORDED=6] \
#       bash benchmarks/diag/serving_profile.sh     (carry .whl, with py-spy's wheel: scripts/fetch_gpu_wheels.sh)
set -u
PRESET=${PRESET:-20b}; N=${N:-1024}; RUNS=${RUNS:-plain json}; RATE=${RATE:-100}; RECORD=${SECONDS_RECORDED:-6}
source benchmarks/gpu_env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SPY=/tmp/site/bin/py-spy
[ -x "$SPY" ] || { echo "py-spy is not among the carried wheels"; exit 1; }
python3 -c "import json; from benchmarks.bench_structured import SCHEMA; print(json.dumps(SCHEMA))" > /tmp/schema.json
log="$OUT/server-profile.log"
python3 -m osserve.cli serve --load-format dummy --preset "$PRESET" --port 8000 \
    --max-num-seqs 256 --max-model-len 4096 --max-num-batched-tokens 8192 > "$log" 2>&1 &
server=$!
wait_for_server $server "$log"
TABLE=/tmp/profile-serve.txt; : > "$TABLE"
round=0
for spec in $RUNS; do
    round=$((round + 1))
    run=${spec%%+*}
    spy=(--nonblocking)
    [[ "$spec" == *+idle* ]] && spy+=(--idle)
    [[ "$spec" == *+native* ]] && spy=(--native)
    extra=(); [ "$run" = json ] && extra=(--json-schema /tmp/schema.json)
    python3 -m osserve.bench.serve --base-url http://127.0.0.1:8000 --model "gpt-oss-$PRESET" \
        --endpoint chat --num-requests "$N" --concurrency 256 --max-tokens 256 --ignore-eos --timeout 200 \
        --prompt "Explain quantum mechanics in one paragraph." "${extra[@]}" > "/tmp/serve-$round.txt" &
    load=$!
    sleep 4  # past the first wave's prefill
    "$SPY" record --pid "$server" --subprocesses --rate "$RATE" --duration "$RECORD" --format raw "${spy[@]}" \
        -o "$OUT/spy-$round-$run.txt" > "/tmp/spy-$round.log" 2>&1 || { echo "py-spy failed (round $round)"; tail -3 "/tmp/spy-$round.log"; }
    wait $load
    tok=$(grep "output token throughput" "/tmp/serve-$round.txt" | grep -oE "[0-9]+\.[0-9]+" | head -1)
    ttft=$(grep "TTFT ms" "/tmp/serve-$round.txt" | grep -oE "[0-9]+\.[0-9]+" | sed -n 2,4p | tr '\n' ' ')
    printf "| %s | %s | %s | %s |\n" "$round" "$spec" "$tok" "$ttft" >> "$TABLE"
    grep "engine: " "$log" | tail -1 | sed 's/^.* INFO osserve: //'
done
kill $server; wait $server 2>/dev/null
for f in "$OUT"/spy-*.txt; do
    python3 benchmarks/diag/collapsed_top.py "$f" --match "_engine_main (process_engine.py)" --rate "$RATE" \
        --duration "$RECORD" --top 45
done
echo
echo "| round | serving c=256, $N requests, 256 out (py-spy sampling) | output tok/s | TTFT p50 p90 p99 ms |"
echo "|---|---|---|---|"
cat "$TABLE"
