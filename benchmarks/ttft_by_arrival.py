"""TTFT of a serving run by when the requests started: is the TTFT of `osserve bench serve` spread
over the whole run, or made by its first wave (every slot's prompt arriving at once)?

    python3 benchmarks/ttft_by_arrival.py serve-20b.json [--bins 10]
"""

from __future__ import annotations

import argparse
import json
import statistics


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--bins", type=int, default=10)
    args = ap.parse_args()
    with open(args.path) as f:
        records = json.load(f)["runs"][0]["records"]
    done = sorted((r["start"], r["ttft"]) for r in records if r["ttft"] is not None)
    size = max(1, len(done) // args.bins)
    print("| requests (by start) | start s | TTFT p50 ms | TTFT max ms |")
    print("|---|---|---|---|")
    for i in range(0, len(done), size):
        part = done[i:i + size]
        ttfts = [t for _, t in part]
        print(f"| {i}-{i + len(part) - 1} | {part[0][0]:.2f} | {1000 * statistics.median(ttfts):.0f} "
              f"| {1000 * max(ttfts):.0f} |")


if __name__ == "__main__":
    main()
