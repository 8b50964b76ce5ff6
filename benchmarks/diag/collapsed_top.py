"""Where a sampled process spends its time, from py-spy's raw (collapsed) stacks: each function's
inclusive and own share of the wall clock, over the samples whose stack holds `--match` (a frame,
`name (file.py)`; default: the engine's step loop). py-spy records only threads that are running
(no `--idle`), so a share is the fraction of the recording that thread spent in the function, on
the CPU.

    py-spy record --pid PID --subprocesses --rate 100 --duration 8 --format raw --nonblocking -o FILE
    python3 benchmarks/diag/collapsed_top.py FILE [FILE ...] --rate 100 --duration 8 [--top 40]
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

FRAME = re.compile(r"^(?P<name>[^ ]+) \((?P<file>[^:)]+)(?::\d+)?\)$")


def frame_name(frame: str) -> str:
    """`name (path/to/file.py:123)` as `name (file.py)`: lines of one function counted together."""
    m = FRAME.match(frame)
    if m is None:
        return frame
    return f"{m['name']} ({Path(m['file']).name})"


def read(path: Path, match: str) -> tuple[Counter[str], Counter[str], int]:
    """Inclusive and own sample counts per function, and the total, over the stacks holding match."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        stack = re.sub(r'process \d+:"[^"]*";', "", stack)  # a command line may hold a ';'
        frames = [frame_name(f) for f in stack.split(";") if not f.startswith("thread ")]
        if match not in frames:
            continue
        n = int(count)
        total += n
        for name in set(frames):
            inclusive[name] += n
        if frames:
            own[frames[-1]] += n
    return inclusive, own, total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--match", default="_step (engine.py)", help="a frame, as this script names them")
    ap.add_argument("--rate", type=float, default=100.0, help="py-spy's samples a second")
    ap.add_argument("--duration", type=float, required=True, help="seconds recorded")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    wall = args.rate * args.duration
    for path in args.files:
        inclusive, own, total = read(path, args.match)
        print(f"\n## {path.name}: the matching thread ran {100 * total / wall:.0f}% of the recording "
              f"({total} samples)")
        print("| function | inclusive % of wall | own % of wall |")
        print("|---|---|---|")
        for name, n in inclusive.most_common(args.top):
            print(f"| {name} | {100 * n / wall:.1f} | {100 * own[name] / wall:.1f} |")
        print("\nown time, top:")
        for name, n in own.most_common(15):
            print(f"  {100 * n / wall:5.1f}%  {name}")


if __name__ == "__main__":
    main()
