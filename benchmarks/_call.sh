source benchmarks/gpu_env.sh
timeout 380 python3 -m pytest -q tests/gpu 2>&1 | tail -3
timeout 60 python3 benchmarks/bench_decode.py --presets 20b --skip moe,prefill,b32,profile 2>&1 | tail -1
timeout 70 python3 benchmarks/bench_decode.py --presets 120b --gpu-memory-utilization 0.95 --skip moe,prefill,b32,profile 2>&1 | tail -1
