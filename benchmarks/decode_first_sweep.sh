#!/usr/bin/env bash
# Decode-first scheduling's trade-off on one GPU, in one call: the 1k-in / 1k-out serving workload of
# issue 38 (unique random prompts, 256 streams, 768 requests) against the 20b, once per server setting,
# in the order given; a table of output tok/s, TTFT p50 / p99, ITL p99 and TPOT p50 is printed last.
#   [PRESET=20b] [N=768] [GPU_UTIL=0.90] bash benchmarks/decode_first_sweep.sh ["SERVER ARGS" ...]   (carry .whl)
# Without arguments, four settings (~2 minutes each: a server's start, then ~60 s of load):
#   1. "--no-decode-first --max-num-batched-tokens 8192"  the issue's measurement (no rule, 8192 a step)
#   2. "--no-decode-first"                                the default step budget alone (16384 for the 20b on an H100)
#   3. ""                                                 the defaults: decode-first, 2048 prompt tokens beside 32+ decodes
#   4. "--decode-first-chunk 1024"                        a smaller chunk
# Others worth a run: "--decode-first-chunk 4096", "--decode-first-min-decodes 128" (more of a burst
# prefilled in large steps before the chunk applies). Split a list over two calls where ten minutes
# do not hold it; the rows of one table compare only within one call (one machine). (INPUT_LEN,
# MAX_TOKENS, CONCURRENCY: for a dry run on a small preset only; the figures use the defaults.)
# The server's flags are serve_ab.sh's, less --max-num-batched-tokens (a setting under test here).
# DIAG_PATH=DIR goes first on the servers' PYTHONPATH (a sitecustomize of benchmarks/diag, e.g.
# gpu_timeline with OSSERVE_GPU_TIMELINE=A-B).
# Settings that start with @DIR serve that directory's code (`git archive OLD | tar -x -C DIR`, carried),
# as serve_ab.sh's do: a same-machine comparison across commits.
set -u
PRESET=${PRESET:-20b}; N=${N:-768}
INPUT_LEN=${INPUT_LEN:-1000}; MAX_TOKENS=${MAX_TOKENS:-1024}; CONCURRENCY=${CONCURRENCY:-256}
if [ $# -eq 0 ]; then
    set -- "--no-decode-first --max-num-batched-tokens 8192" "--no-decode-first" "" "--decode-first-chunk 1024"
fi
source benchmarks/gpu_env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
: > "$OUT/df-runs-$PRESET.txt"
run=0
for server_args in "$@"; do
    run=$((run + 1))
    log="$OUT/server-df-$PRESET-$run.log"
    tree=.; settings=$server_args
    if [[ $server_args == @* ]]; then tree=${server_args%% *}; tree=${tree#@}; settings=${server_args#"@$tree"}; fi
    # shellcheck disable=SC2086  # the settings are words
    (cd "$tree" && PYTHONPATH="${DIAG_PATH:+$DIAG_PATH:}$PWD:/tmp/site" exec python3 -m osserve.cli serve --load-format dummy \
        --preset "$PRESET" --port 8000 --max-num-seqs 256 --max-model-len 4096 \
        --gpu-memory-utilization "${GPU_UTIL:-0.90}" $settings) > "$log" 2>&1 &
    server=$!
    wait_for_server $server "$log"
    echo "== run $run: ${server_args:-(defaults)}"
    grep -E "memory plan|scheduler:" "$log" | sed 's/^.* INFO osserve: //' | tail -2
    python3 -m osserve.bench.serve --base-url http://127.0.0.1:8000 --model "gpt-oss-$PRESET" \
        --endpoint completions --dataset random --input-len "$INPUT_LEN" --max-tokens "$MAX_TOKENS" --ignore-eos \
        --concurrency "$CONCURRENCY" --num-requests "$N" --timeout 300 \
        --output-json "$OUT/serve-df-$PRESET-$run.json" | grep -E "completed|output token|TTFT ms|ITL ms"
    grep "engine: " "$log" | tail -1
    late_compiles "$log"
    echo "$run|${server_args:-(defaults)}|$OUT/serve-df-$PRESET-$run.json" >> "$OUT/df-runs-$PRESET.txt"
    kill $server; wait $server 2>/dev/null
    sleep 3  # the port and the GPU's memory free again
done
python3 - "$OUT/df-runs-$PRESET.txt" <<'EOF'
import json, sys
print("| run | server settings | output tok/s | TTFT p50 ms | TTFT p99 ms | ITL p99 ms | TPOT p50 ms | completed / failed |")
print("|---|---|---|---|---|---|---|---|")
for line in open(sys.argv[1]):
    run, settings, path = line.rstrip("\n").split("|")
    try:
        s = json.load(open(path))["runs"][0]["summary"]
    except (OSError, ValueError, IndexError, KeyError):
        print(f"| {run} | {settings} | no result | | | | | |")
        continue
    print(f"| {run} | {settings} | {s['output_throughput']:,.1f} | {s['ttft_ms']['p50']:,.0f} | "
          f"{s['ttft_ms']['p99']:,.0f} | {s['itl_ms']['p99']:,.1f} | {s['tpot_ms']['p50']:.1f} | "
          f"{s['completed']} / {s['failed']} |")
EOF
rm -f "$OUT/df-runs-$PRESET.txt"
