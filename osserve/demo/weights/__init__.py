"""The shipped demo model: `demo-seed0.safetensors`, the compact checkpoint (demo/compact.py) that
`python -m osserve.demo.train --seed 0` wrote on one H100 (benchmarks/results/demo-train.log); and
its EAGLE3 draft, `draft-seed0.safetensors` (demo/draft_compact.py), written by
`python -m osserve.demo.train_draft --seed 0` (benchmarks/results/demo-draft-train.log)."""

from pathlib import Path

DEMO_WEIGHTS = Path(__file__).with_name("demo-seed0.safetensors")
DEMO_DRAFT = Path(__file__).with_name("draft-seed0.safetensors")
BUILTIN_NAME = "osserve-builtin"  # the name the built-in model is served under by default
