#!/usr/bin/env bash
# The serving stress test for several server settings in one call on the lent GPU, in the order
# given (repeat one to see the spread): for each, start `osserve serve` with random weights of the
# real shapes, run the field's workload, stop it. A table of the runs is printed last.
#   [GPU_UTIL=0.97] [N=2000] bash benchmarks/serve_ab.sh PRESET MAX_TOKENS "SERVER ARGS A" "SERVER ARGS B" ...
# (carry .whl; an empty string is the default settings). Settings that start with @DIR serve that
# directory's code (e.g. "@.old-tree --api-server-count 2", after `git archive OLD | tar -x -C
# .old-tree`, carried): a same-machine comparison across commits.
set -u
PRESET=$1; MAX_TOKENS=$2; shift 2
source benchmarks/gpu_env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
TABLE="$OUT/serve-ab-$PRESET.txt"
: > "$TABLE"
run=0
for server_args in "$@"; do
    run=$((run + 1))
    log="$OUT/server-ab-$PRESET-$run.log"
    tree=.; settings=$server_args
    if [[ $server_args == @* ]]; then tree=${server_args%% *}; tree=${tree#@}; settings=${server_args#"@$tree"}; fi
    # shellcheck disable=SC2086  # the settings are words
    (cd "$tree" && PYTHONPATH="$PWD:/tmp/site" exec python3 -m osserve.cli serve --load-format dummy \
        --preset "$PRESET" --port 8000 --max-num-seqs 256 --max-model-len 4096 --max-num-batched-tokens 8192 \
        --gpu-memory-utilization "${GPU_UTIL:-0.90}" $settings) > "$log" 2>&1 &
    server=$!
    wait_for_server $server "$log"
    result=$(python3 -m osserve.bench.serve --base-url http://127.0.0.1:8000 --model "gpt-oss-$PRESET" \
        --endpoint chat --num-requests "${N:-2000}" --concurrency 256 --max-tokens "$MAX_TOKENS" --ignore-eos \
        --timeout 330 --prompt "Explain quantum mechanics in one paragraph." \
        --output-json "$OUT/serve-ab-$PRESET-$run.json")
    echo "$result" | grep -E "completed|output token|TTFT ms"
    late_compiles "$log"
    tok=$(echo "$result" | grep "output token throughput" | grep -oE "[0-9]+\.[0-9]+" | head -1)
    ttft=$(echo "$result" | grep "TTFT ms" | grep -oE "[0-9]+\.[0-9]+" | sed -n 2,4p | tr '\n' ' ')
    failed=$(echo "$result" | grep "completed / failed" | grep -oE "[0-9]+ / [0-9]+")
    printf "| %d | %s | %s | %s | %s |\n" "$run" "${server_args:-(defaults)}" "$tok" "$ttft" "$failed" >> "$TABLE"
    kill $server; wait $server 2>/dev/null
    sleep 3  # the port and the GPU's memory free again
done
echo "| run | server settings | output tok/s | TTFT p50 p90 p99 ms | completed / failed |"
cat "$TABLE"
