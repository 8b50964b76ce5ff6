#!/usr/bin/env bash
# The serving stress test on the lent GPU: starts `osserve serve` with random weights of the real
# shapes, runs the field's published workload with `osserve bench serve`, then a concurrency sweep.
#   [GPU_UTIL=0.97] [MAX_SEQS=256] [SWEEP=0] [SERVER_ARGS="--admission-delay-ms 50"] [TAG=x] [SERVER_TREE=dir] bash benchmarks/serve_bench.sh PRESET MAX_TOKENS [NUM_REQUESTS]  (carry .whl)
set -u
PRESET=${1:-20b}; MAX_TOKENS=${2:-256}; N=${3:-2000}
source benchmarks/gpu_env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# SERVER_TREE: serve another checkout's code (e.g. `git archive OLD | tar -x -C old-OLD`) with this
# checkout's load generator: a same-machine comparison across commits. The server starts inside
# that tree (`python3 -m` puts the working directory first on sys.path).
(cd "${SERVER_TREE:-.}" && PYTHONPATH="$PWD:/tmp/site" exec python3 -m osserve.cli serve --load-format dummy --preset "$PRESET" --port 8000 --max-num-seqs "${MAX_SEQS:-256}" \
    --max-model-len 4096 --max-num-batched-tokens 8192 --gpu-memory-utilization "${GPU_UTIL:-0.90}" \
    ${SERVER_ARGS:-}) > "$OUT/server-$PRESET${TAG:-}.log" 2>&1 &
SERVER=$!
wait_for_server $SERVER "$OUT/server-$PRESET${TAG:-}.log"
grep -i "memory plan" "$OUT/server-$PRESET${TAG:-}.log" | tail -1
# CPU per process while the load runs (is the HTTP process, the engine or the load generator saturated?)
(sleep 20; top -b -d 5 -n 3 -w 200 | grep -E "python|PID" > "$OUT/top-$PRESET${TAG:-}.txt") &
python3 -m osserve.bench.serve --base-url http://127.0.0.1:8000 --model "gpt-oss-$PRESET" --endpoint chat \
    --num-requests "$N" --concurrency 256 --max-tokens "$MAX_TOKENS" --ignore-eos --timeout 330 \
    --prompt "Explain quantum mechanics in one paragraph." --output-json "$OUT/serve-$PRESET${TAG:-}.json"
if [ "${SWEEP:-1}" = 1 ]; then
    python3 -m osserve.bench.serve --base-url http://127.0.0.1:8000 --model "gpt-oss-$PRESET" --endpoint chat \
        --num-requests 512 --sweep 1,8,32,128,256 --max-tokens 128 --ignore-eos --timeout 60 \
        --output-json "$OUT/sweep-$PRESET.json" --plot "$OUT/sweep-$PRESET.png" | grep -E "concurrency|output token|TTFT"
fi
grep "engine: " "$OUT/server-$PRESET${TAG:-}.log" | tail -2
curl -s http://127.0.0.1:8000/metrics | grep -E "^osserve:(prefix_cache|num_preemptions)"
cat "$OUT/top-$PRESET${TAG:-}.txt" 2>/dev/null | grep -v "^ *$" | grep -v " 0.0 .* 0:00" | head -30
python3 benchmarks/ttft_by_arrival.py "$OUT/serve-$PRESET${TAG:-}.json"
kill $SERVER; wait $SERVER 2>/dev/null
