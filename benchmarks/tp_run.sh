#!/usr/bin/env bash
# Tensor and expert parallelism on a multi-GPU host (random weights of the real shapes), printed as
# one table: agreement with TP 1 (on random weights not correctness: tp_bench.py's docstring) and
# batch-1 / batch-32 decode (benchmarks/tp_bench.py), and the 1k/1k serving workload (random
# ~1024-word prompts, 1024 output tokens, ignore_eos) at concurrency 256 and 512 against `osserve
# serve --tensor-parallel-size N`.
#   bash benchmarks/tp_run.sh PRESETS LAYOUTS [PHASES]      (from the repository root; carry .whl)
# LAYOUTS: comma list of N (tensor parallel over N GPUs), Nep (--enable-expert-parallel), or, for
# the serve phase only, Kx1 (K one-GPU servers side by side); the engine phase needs 1 first (its
# reference) and leaves Kx1 out. PHASES: comma list of
#   engine  tp_bench.py: agreement with TP 1, batch-1 and batch-32 decode (one engine a layout)
#   serve   a server per layout, then bench serve at c=256 and c=512 (2 x c requests each)
#   tests   tests/gpu/test_tp_gpu.py (needs pytest on the machine)
# default PHASES: engine,serve; CONCURRENCIES (env): the serve phase's, default "256 512". A device
# command may run 10 minutes: split the work, e.g. on 4 H100s
#   bash benchmarks/tp_run.sh 20b,120b 1,2,4,4ep engine
#   bash benchmarks/tp_run.sh 120b 2 serve;  bash benchmarks/tp_run.sh 120b 4 serve;  bash benchmarks/tp_run.sh 120b 4ep serve
#   bash benchmarks/tp_run.sh 20b 2,2x1 serve      (the 20b over 2 GPUs against two one-GPU servers)
# and print the table of every call's files together afterwards: python3 benchmarks/tp_bench.py --table DIR
set -u
PRESETS=${1:-20b}; LAYOUTS=${2:-1,2,4,8}; PHASES=${3:-engine,serve}
source benchmarks/gpu_env.sh || exit 1
# This workplace's hosts: no NVLink multicast (KINDS.md); the workers inherit the environment.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
GPUS=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
nvidia-smi topo -m 2>/dev/null | head -$((GPUS + 1))

if [[ ",$PHASES," == *",engine,"* ]]; then
    python3 benchmarks/tp_bench.py --presets "$PRESETS" --layouts "$(tr ',' '\n' <<< "$LAYOUTS" | grep -v x1 | paste -sd,)" \
        --out "$OUT/tp-{preset}.json" \
        2>&1 | tee "$OUT/engine.log" | grep -E "^\{|left out|Error|error" || true
fi

# serve_layout PRESET LAYOUT: its servers up, bench serve at c=256 and c=512, its servers down.
# LAYOUT: N or Nep (one server over N GPUs), or Kx1 (K one-GPU servers, one a GPU, each loaded with
# c/K of the streams at once: the outputs per second summed; is TP worth it over K copies?).
serve_layout() {
    local preset=$1 layout=$2 servers=() ports=() gpus=1 k=1 flags=""
    if [[ "$layout" == *x1 ]]; then k=${layout%x1}; else
        gpus=${layout%ep}; flags="--tensor-parallel-size $gpus"
        [ "$layout" != "$gpus" ] && flags="$flags --enable-expert-parallel"
    fi
    if [ $((k * gpus)) -gt "$GPUS" ]; then echo "$preset $layout: left out, $GPUS GPUs"; return; fi
    for i in $(seq 0 $((k - 1))); do
        local port=$((8000 + i)) log="$OUT/server-$preset-tp$layout-$i.log"
        local only=""  # K servers: one GPU each
        [ "$k" -gt 1 ] && only="env CUDA_VISIBLE_DEVICES=$i"
        $only python3 -m osserve.cli serve --load-format dummy --preset "$preset" \
            --port $port $flags --max-num-seqs 512 --max-model-len 4096 --max-num-batched-tokens 8192 \
            --gpu-memory-utilization "${GPU_UTIL:-0.90}" ${SERVER_ARGS:-} > "$log" 2>&1 &
        servers+=($!); ports+=($port)
    done
    for i in "${!servers[@]}"; do
        local log="$OUT/server-$preset-tp$layout-$i.log"
        for _ in $(seq 1 400); do
            curl -sf "http://127.0.0.1:${ports[$i]}/health" >/dev/null && break
            kill -0 "${servers[$i]}" 2>/dev/null || { echo "server died"; tail -30 "$log"; kill "${servers[@]}"; return; }
            sleep 1
        done
        grep -E "memory plan|tensor parallelism" "$log" | sed 's/^.*INFO //'
    done
    for c in ${CONCURRENCIES:-256 512}; do
        local parts=()
        for i in "${!servers[@]}"; do
            python3 -m osserve.bench.serve --base-url "http://127.0.0.1:${ports[$i]}" --model "gpt-oss-$preset" \
                --endpoint completions --dataset random --input-len 1024 --max-tokens 1024 --ignore-eos \
                --num-requests $((2 * c / k)) --concurrency $((c / k)) --timeout 240 \
                --output-json "$OUT/part-$preset-$layout-c$c-$i.json" > "$OUT/part-$preset-$layout-c$c-$i.txt" 2>&1 &
            parts+=($!)
        done
        wait "${parts[@]}"
        grep -hE "output token|TTFT|completed" "$OUT"/part-$preset-$layout-c$c-*.txt
        python3 - "$OUT/serve-$preset-tp$layout-c$c.json" "$OUT"/part-$preset-$layout-c$c-*.json <<'PY'
import json, sys
parts = [json.load(open(p)) for p in sys.argv[2:]]
summaries = [p["runs"][0]["summary"] for p in parts if p["runs"]]
total = {"output_throughput": sum(s["output_throughput"] for s in summaries),
         "failed": sum(s["failed"] for s in summaries) + len(parts) - len(summaries), "servers": len(parts)}
json.dump({"runs": [{"summary": total}], "parts": parts}, open(sys.argv[1], "w"))
print(f"{sys.argv[1]}: {total['output_throughput']:.1f} output tok/s over {len(parts)} server(s)")
PY
    done
    grep -h "engine: " "$OUT"/server-$preset-tp$layout-*.log | tail -1
    kill "${servers[@]}"; wait "${servers[@]}" 2>/dev/null
}

if [[ ",$PHASES," == *",serve,"* ]]; then
    for preset in ${PRESETS//,/ }; do
        for layout in ${LAYOUTS//,/ }; do serve_layout "$preset" "$layout"; done
    done
fi

if [[ ",$PHASES," == *",tests,"* ]]; then
    if python3 -c "import pytest" 2>/dev/null; then
        python3 -m pytest -q -x tests/gpu/test_tp_gpu.py 2>&1 | tail -15
    else
        echo "tests: pytest is not installed here (carry its wheel in .whl)"
    fi
fi

python3 benchmarks/tp_bench.py --table "$OUT"
