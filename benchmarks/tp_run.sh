#!/usr/bin/env bash
# Tensor and expert parallelism on a multi-GPU host (random weights of the real shapes), printed as
# one table: correctness against TP 1 and batch-1 / batch-32 decode (benchmarks/tp_bench.py), and
# the 1k/1k serving workload (random ~1024-word prompts, 1024 output tokens, ignore_eos) at
# concurrency 256 and 512 against `osserve serve --tensor-parallel-size N`.
#   bash benchmarks/tp_run.sh PRESETS LAYOUTS [PHASES]      (from the repository root; carry .whl)
# LAYOUTS: comma list of N (tensor parallel over N GPUs) or Nep (--enable-expert-parallel); the
# engine phase needs 1 first (its reference). PHASES: comma list of
#   engine  tp_bench.py: correctness against TP 1, batch-1 and batch-32 decode (one engine a layout)
#   serve   a server per layout, then bench serve at c=256 and c=512 (2 x c requests each)
#   tests   tests/gpu/test_tp_gpu.py (needs pytest on the machine)
# default: engine,serve. A device command may run 10 minutes: split the work, e.g. on 4 H100s
#   bash benchmarks/tp_run.sh 20b,120b 1,2,4,4ep engine
#   bash benchmarks/tp_run.sh 120b 2 serve;  bash benchmarks/tp_run.sh 120b 4 serve;  bash benchmarks/tp_run.sh 120b 4ep serve
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
    python3 benchmarks/tp_bench.py --presets "$PRESETS" --layouts "$LAYOUTS" --out "$OUT/tp-{preset}.json" \
        2>&1 | tee "$OUT/engine.log" | grep -E "^\{|left out|Error|error" || true
fi

if [[ ",$PHASES," == *",serve,"* ]]; then
    for preset in ${PRESETS//,/ }; do
        for layout in ${LAYOUTS//,/ }; do
            n=${layout%ep}; tag=tp$layout
            flags="--tensor-parallel-size $n"
            [ "$layout" != "$n" ] && flags="$flags --enable-expert-parallel"
            if [ "$n" -gt "$GPUS" ]; then echo "$preset $tag: left out, $GPUS GPUs"; continue; fi
            log="$OUT/server-$preset-$tag.log"
            python3 -m osserve.cli serve --load-format dummy --preset "$preset" --port 8000 $flags \
                --max-num-seqs 512 --max-model-len 4096 --max-num-batched-tokens 8192 \
                --gpu-memory-utilization "${GPU_UTIL:-0.90}" ${SERVER_ARGS:-} > "$log" 2>&1 &
            server=$!
            wait_for_server $server "$log"
            grep -E "memory plan|tensor parallelism" "$log" | sed 's/^.*INFO //'
            for c in 256 512; do
                python3 -m osserve.bench.serve --base-url http://127.0.0.1:8000 --model "gpt-oss-$preset" \
                    --endpoint completions --dataset random --input-len 1024 --max-tokens 1024 --ignore-eos \
                    --num-requests $((2 * c)) --concurrency $c --timeout 240 \
                    --output-json "$OUT/serve-$preset-$tag-c$c.json" | grep -E "output token|TTFT|completed"
            done
            grep "engine: " "$log" | tail -1
            kill $server; wait $server 2>/dev/null
        done
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
