"""The shipped demo model: `demo-seed0.safetensors`, the compact checkpoint (demo/compact.py) that
`python -m osserve.demo.train --seed 0` wrote on one H100 (benchmarks/results/demo-train.log)."""

from pathlib import Path

DEMO_WEIGHTS = Path(__file__).with_name("demo-seed0.safetensors")
