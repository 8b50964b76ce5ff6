"""Where a kernel's warps wait, from Nsight Compute's source page (ncu_run.sh's NAME-source.csv):
the stall reasons summed over the kernel, then the SASS lines with the most samples.

    python3 benchmarks/ncu_stalls.py moe20-1-source.csv [lines]
"""

from __future__ import annotations

import csv
import sys
from collections import Counter


def kernels(path: str) -> dict[str, list[dict[str, str]]]:
    """Kernel name -> its SASS rows (column name -> value); the file holds one table per kernel."""
    tables: dict[str, list[dict[str, str]]] = {}
    name, header = None, None
    with open(path) as f:
        for row in csv.reader(f):
            if not row:
                continue
            if row[0] == "Kernel Name":
                name, header = row[1], None
                tables.setdefault(name, [])
            elif row[0] == "Address":
                header = row
            elif header and name:
                tables[name].append(dict(zip(header, row, strict=False)))  # a row may end early
    return tables


def stalls(row: dict[str, str]) -> Counter[str]:
    """The row's samples by stall reason (issued or not)."""
    return Counter({k[len("stall_"):]: int(v) for k, v in row.items()
                    if k.startswith("stall_") and "Not Issued" not in k and v.isdigit()})


def main() -> None:
    lines = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    for name, rows in kernels(sys.argv[1]).items():
        total_by_reason = sum((stalls(r) for r in rows), Counter())
        total = sum(int(r["Warp Stall Sampling (All Samples)"] or 0) for r in rows) or 1
        print(f"{name}: {total} samples over {len(rows)} instructions")
        print("  " + ", ".join(f"{k} {v / total:.1%}" for k, v in total_by_reason.most_common(10)))
        for r in sorted(rows, key=lambda r: -int(r["Warp Stall Sampling (All Samples)"] or 0))[:lines]:
            share = int(r["Warp Stall Sampling (All Samples)"] or 0) / total
            top = dict(stalls(r).most_common(3))
            print(f"  {share:6.1%} {r['Source'].strip()[:60]:60s} {top}")


if __name__ == "__main__":
    main()
