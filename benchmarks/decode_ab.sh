#!/usr/bin/env bash
# Same-call A/B of decode speed on the lent GPU: bench_decode.py's batch-1 and batch-32 decode
# (random weights of the real shapes; no prefill, profile or MoE-alone runs) on another tree and on
# this one, alternating, ROUNDS times per preset. A table of every run is printed last.
#   bash benchmarks/decode_ab.sh OTHER_TREE PRESETS [ROUNDS]      (carry .whl and OTHER_TREE)
# OTHER_TREE: e.g. `mkdir -p .ab/old && git archive COMMIT | tar -x -C .ab/old` here, with .ab/ ignored.
set -euo pipefail
source benchmarks/gpu_env.sh
other=$(cd "$1" && pwd); presets=$2; rounds=${3:-1}
here=$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
for preset in ${presets//,/ }; do
    for round in $(seq "$rounds"); do
        for tree in "$other" "$here"; do
            tag=$([ "$tree" = "$here" ] && echo this || echo other)
            echo "== $(date +%T) $preset round $round: $tag tree ($tree)"
            (cd "$tree" && PYTHONPATH="$tree:/tmp/site" python3 benchmarks/bench_decode.py --presets "$preset" \
                --skip prefill,profile,moe --out "$OUT/ab-$preset-$round-$tag.json" >"/tmp/ab-$preset-$round-$tag.log" 2>&1) \
                || { tail -30 "/tmp/ab-$preset-$round-$tag.log"; exit 1; }
        done
    done
done
python3 - "$OUT" <<'EOF'
import json, pathlib, sys
print(f"\n{'run':>24} {'b1 tok/s':>9} {'b1 TPOT ms':>10} {'b32 tok/s':>10}")
for f in sorted(pathlib.Path(sys.argv[1]).glob("ab-*.json")):
    for r in json.loads(f.read_text()).values():
        print(f"{f.stem[3:]:>24} {r['batch1']['decode_tok_s']:>9.1f} {r['batch1']['tpot_median_ms']:>10.3f} "
              f"{r['batch32']['decode_tok_s']:>10.1f}")
EOF
