#!/usr/bin/env bash
# Structured outputs' cost on the lent GPU, same call: the engine at batch 1 and 32
# (bench_structured.py), then serving at c=256 with every request asking for a JSON schema against
# none, alternating on one server (plain, json, plain, json: the first json round also pays the
# schema's first compile). TTFT is the first text; the first event is the role chunk, sent once the
# first token is sampled (with a schema, a random-weight model's first three are harmony's header,
# which carries no text). With MASK_THREADS="8 1" the serving part runs once per llguidance
# mask-thread count (OSSERVE_MASK_THREADS), a server each. RUNS sets the rounds: plain, json (the
# schema), nomax (the schema without its strings' maxLength, what the length bound costs) and long
# (no constraint, the schema's text in the user's message instead: in chat a json request's prompt
# holds the schema, 155 tokens against 63, and long's holds as many, so json against long is the
# grammar's cost alone).
# After each round: the engine's log windows of that round, and each server process's share of a core
# over it (benchmarks/diag/process_cpu.py: the engine, the HTTP servers, the grammar processes).
# DIAG_PATH=DIR goes first on the server's PYTHONPATH: a sitecustomize of benchmarks/diag (e.g.
# gpu_timeline, with its OSSERVE_GPU_TIMELINE; gc_time, whose engine lines each round prints) then
# runs in its processes. PROBE_CPU=C runs benchmarks/diag/host_probe.py on CPU C beside each round
# (whether the round slows other Python on the host) and prints its line.
# Tables printed last.
# TREES="DIR ..." serves each directory's code in turn (e.g. `git archive OLD | tar -x -C .ab/OLD`,
# carried): a same-machine comparison across commits. ENDPOINT=completions sends raw completions
# instead of chat: the schema then binds the whole output, whose first token is text with a schema
# or without (no harmony header), so TTFT compares the two directly.
#   [PRESET=20b] [N=1024] [SKIP_ENGINE=1] [MASK_THREADS="8 1"] [RUNS="plain json nomax"] [TREES=". .ab/OLD"] [ENDPOINT=chat] \
#       bash benchmarks/structured_ab.sh   (carry .whl)
set -u
PRESET=${PRESET:-20b}; N=${N:-1024}; MASK_THREADS=${MASK_THREADS:-default}; RUNS=${RUNS:-plain json plain json}
TREES=${TREES:-.}; ENDPOINT=${ENDPOINT:-chat}
source benchmarks/gpu_env.sh
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if [ -z "${SKIP_ENGINE:-}" ]; then
    python3 benchmarks/bench_structured.py --preset "$PRESET" --out "$OUT/structured-engine.json" > "$OUT/engine.log" 2>&1 \
        || { tail -30 "$OUT/engine.log"; exit 1; }
fi
python3 -c "import json; from benchmarks.bench_structured import SCHEMA; print(json.dumps(SCHEMA))" > /tmp/schema.json
python3 -c "import json; from benchmarks.bench_structured import SCHEMA; del SCHEMA['properties']['steps']['items']['maxLength']; print(json.dumps(SCHEMA))" > /tmp/schema-nomax.json
PROMPT="Explain quantum mechanics in one paragraph."
LONG_PROMPT="$PROMPT Answer as JSON that follows this schema, and keep the answer short: $(python3 -c "import json; from benchmarks.bench_structured import SCHEMA; print(json.dumps(SCHEMA, separators=(',', ':')))")"
TABLE="$OUT/structured-serve.txt"; : > "$TABLE"
for tree in $TREES; do
for threads in $MASK_THREADS; do
    log="$OUT/server-threads-$threads-${tree//[\/.]/_}.log"
    env_threads=(); [ "$threads" != default ] && env_threads=(OSSERVE_MASK_THREADS="$threads")
    (cd "$tree" && PYTHONPATH="${DIAG_PATH:+$DIAG_PATH:}$PWD:/tmp/site" exec env "${env_threads[@]}" python3 -m osserve.cli serve \
        --load-format dummy --preset "$PRESET" --port 8000 --max-num-seqs 256 --max-model-len 4096 \
        --max-num-batched-tokens 8192) > "$log" 2>&1 &
    server=$!
    wait_for_server $server "$log"
    round=0
    for run in $RUNS; do
        round=$((round + 1))
        logged=$(wc -l < "$log")
        python3 benchmarks/diag/process_cpu.py snapshot $server > /tmp/cpu-before.json
        if [ -n "${PROBE_CPU:-}" ]; then taskset -c "$PROBE_CPU" python3 benchmarks/diag/host_probe.py > /tmp/probe.txt & probe=$!; fi
        extra=(); [ "$run" = json ] && extra=(--json-schema /tmp/schema.json)
        [ "$run" = nomax ] && extra=(--json-schema /tmp/schema-nomax.json)
        prompt=$PROMPT; [ "$run" = long ] && prompt=$LONG_PROMPT
        result=$(python3 -m osserve.bench.serve --base-url http://127.0.0.1:8000 --model "gpt-oss-$PRESET" \
            --endpoint "$ENDPOINT" --num-requests "$N" --concurrency 256 --max-tokens 256 --ignore-eos --timeout 200 \
            --prompt "$prompt" "${extra[@]}" \
            --output-json "$OUT/serve-$threads-$run.json")
        python3 benchmarks/diag/process_cpu.py snapshot $server > /tmp/cpu-after.json
        [ -n "${PROBE_CPU:-}" ] && { kill -INT $probe; wait $probe; }
        echo "== round $round ($tree, threads $threads): $run"
        tail -n +"$((logged + 1))" "$log" | grep "engine: " | sed 's/^.* INFO osserve: //'
        tail -n +"$((logged + 1))" "$log" | grep "^gc: osserve-engine"
        [ -n "${PROBE_CPU:-}" ] && cat /tmp/probe.txt
        python3 benchmarks/diag/process_cpu.py diff /tmp/cpu-before.json /tmp/cpu-after.json | head -8
        tok=$(echo "$result" | grep "output token throughput" | grep -oE "[0-9]+\.[0-9]+" | head -1)
        ttft=$(echo "$result" | grep "TTFT ms" | grep -oE "[0-9]+\.[0-9]+" | sed -n 2,4p | tr '\n' ' ')
        first=$(echo "$result" | grep "first event ms" | grep -oE "[0-9]+\.[0-9]+" | sed -n 2,4p | tr '\n' ' ')
        failed=$(echo "$result" | grep "completed / failed" | grep -oE "[0-9]+ / [0-9]+")
        printf "| %s | %s | %s | %s | %s | %s | %s |\n" "$tree" "$threads" "$run" "$tok" "$ttft" "$first" "$failed" \
            >> "$TABLE"
    done
    kill $server; wait $server 2>/dev/null
    sleep 3  # the port and the GPU's memory free again
done
done
[ -z "${SKIP_ENGINE:-}" ] && tail -14 "$OUT/engine.log"
echo "| code | mask threads | serving c=256, $N $ENDPOINT requests, 256 out | output tok/s | TTFT p50 p90 p99 ms | first event (first token) p50 p90 p99 ms | completed / failed |"
echo "|---|---|---|---|---|---|---|"
cat "$TABLE"
