# Sourced at the start of every command on the lent GPU machine (its image has torch and triton
# but not the server's packages): installs the carried wheels from .whl/ and points Python at
# them and at this checkout. Usage: `source benchmarks/gpu_env.sh` with `.whl` carried.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH="$PWD:/tmp/site"
export PYTHONUNBUFFERED=1
export OSSERVE_CACHE_DIR=/tmp/osserve-cache
osserve() { python3 -m osserve.cli "$@"; }
# wait_for_server PID LOG: until the server on :8000 answers /health (exits the script if it dies first)
wait_for_server() {
    for _ in $(seq 1 300); do
        curl -sf http://127.0.0.1:8000/health >/dev/null && return 0
        kill -0 "$1" 2>/dev/null || { echo "server died"; tail -30 "$2"; exit 1; }
        sleep 1
    done
}
# late_compiles LOG: the kernels a server's warm-up missed (engine/compile_log.py's warnings; a tree
# older than 312dc19 logs none), counted, then each, cut to 400 characters
late_compiles() {
    echo "late compiles: $(grep -c "after the warm-up" "$1")"; grep "after the warm-up" "$1" | cut -c1-400
}
