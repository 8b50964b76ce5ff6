#!/usr/bin/env bash
# Downloads into .whl/ the wheels the lent GPU machine lacks (its image has torch, triton, numpy,
# httpx, rich, matplotlib, prometheus-client but not the server's packages), for Python 3.12 on
# x86-64. Carry `.whl` in the device call and `source benchmarks/gpu_env.sh` to install them.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
PKGS=(fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0
      typing-inspection==0.4.5 typing-extensions==4.16.0 annotated-doc==0.0.7 uvicorn==0.54.0 h11==0.16.0
      anyio==4.16.0 sniffio==1.3.1 openai-harmony==0.0.8 quicktok-v1==0.4.0 opentelemetry-api==1.45.2
      uvloop==0.23.0 httptools==0.9.0 llguidance==1.9.1
      py-spy==0.4.3  # benchmarks/diag/serving_profile.sh only
      jsonschema==4.26.0 attrs==26.1.0 referencing==0.37.0 jsonschema-specifications==2025.9.1
      rpds-py==2026.9.1)  # jsonschema: tests/gpu/test_structured_gpu.py
for p in "${PKGS[@]}"; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .whl "$p"
done
ls -la .whl
