#!/usr/bin/env bash
# Trains the built-in demo model on the lent GPU and scores it, in one device call:
#   run(command="bash scripts/train_demo_gpu.sh", carry=[".whl"])
# The compact checkpoint comes back as $OUT/demo.safetensors (copy it to osserve/demo/weights/).
set -euo pipefail
source benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -m osserve.demo.train --out "$OUT/demo.safetensors" --seed "${SEED:-0}" --steps "${STEPS:-4000}" \
    --max-seconds "${MAX_SECONDS:-430}" 2>&1 | tee "$OUT/train.log"
python3 -m osserve.demo.evaluate --compact "$OUT/demo.safetensors" --n 200 --device cuda 2>&1 | tee "$OUT/eval.log"
