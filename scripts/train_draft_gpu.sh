#!/usr/bin/env bash
# Trains the built-in model's EAGLE3 draft on the lent GPU and measures it, in one device call:
#   run(command="bash scripts/train_draft_gpu.sh", carry=[".whl"])
# The draft comes back as $OUT/draft.safetensors (copy it to osserve/demo/weights/draft-seed0.safetensors),
# with the training log and each speculative config's mean acceptance length on held-out prompts.
set -euo pipefail
source benchmarks/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -m osserve.demo.train_draft --out "$OUT/draft.safetensors" --seed "${SEED:-0}" --steps "${STEPS:-2000}" \
    --batch-size "${BATCH:-32}" --examples "${EXAMPLES:-4000}" --max-seconds "${MAX_SECONDS:-360}" 2>&1 \
    | tee "$OUT/draft-train.log"
python3 -m osserve.demo.draft_eval --draft "$OUT/draft.safetensors" --n 64 --device cuda 2>&1 | tee "$OUT/draft-eval.log"
