#!/usr/bin/env bash
# benchmarks/diag/tp_hang.py under a time limit, every rank's step paths traced (trace_steps/), and
# py-spy dumps (Python and native frames) of every rank's process if it is still running DUMP_AT
# seconds in. Sourced setup: benchmarks/gpu_env.sh (carry .whl, which holds py-spy).
#   bash benchmarks/diag/tp_hang.sh PRESET TP LIMIT_S DUMP_AT_S [tp_hang.py flags]
set -u
preset=$1 tp=$2 limit=$3 dump_at=$4; shift 4
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
log=${OUT:-/tmp}/hang-$preset-tp$tp.log
OSSERVE_TRACE_STEPS=1 PYTHONPATH="$PWD/benchmarks/diag/trace_steps:${PYTHONPATH:-}" \
    timeout "$limit" python3 benchmarks/diag/tp_hang.py --preset "$preset" --tp "$tp" "$@" > "$log" 2>&1 &
pid=$!
for _ in $(seq 1 "$dump_at"); do kill -0 $pid 2>/dev/null || break; sleep 1; done
if kill -0 $pid 2>/dev/null; then
    echo "== $preset TP $tp still running after $dump_at s: py-spy dumps"
    for p in $(pgrep -f "tp_hang.py|osserve.distributed.worker"); do
        echo "--- pid $p: $(tr '\0' ' ' < /proc/$p/cmdline | cut -c1-100)"
        /tmp/site/bin/py-spy dump --native --pid "$p" 2>&1 | head -60
    done
    nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader
fi
wait $pid; echo "== $preset TP $tp exit $?"
grep -v "^\[trace" "$log" | tail -25
echo "-- last traced steps of each process"
for p in $(grep -o "^\[trace pid [0-9]*" "$log" | sort -u | awk '{print $3}'); do
    grep "^\[trace pid $p " "$log" | tail -4
done
