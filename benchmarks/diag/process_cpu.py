"""Which of a server's processes is busy under a load: the CPU seconds of every process under a
root pid (the supervisor, the engine, the HTTP servers, the grammar processes, their threads
together), between two snapshots, as a share of one core over the wall time between them.

    python3 benchmarks/diag/process_cpu.py snapshot ROOT_PID > before.json
    ... the load ...
    python3 benchmarks/diag/process_cpu.py snapshot ROOT_PID > after.json
    python3 benchmarks/diag/process_cpu.py diff before.json after.json

A process near 100% of a core is the one a load waits on, whatever the engine's log says of its
own loop. Linux only (/proc).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float, int] | None:
    """(parent pid, CPU seconds, threads) of a live process, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # after the command's name, which may hold spaces
    # fields[0] is the state (stat's 3rd field): ppid the 4th, utime / stime the 14th / 15th, threads the 20th
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS, int(fields[17])


def _label(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"
    if "grammar_child" in cmd:
        return "grammar process"
    if "multiprocessing" in cmd:
        return "spawned (engine or HTTP server)"
    return " ".join(cmd.split())[:80]


def snapshot(root: int) -> dict[str, object]:
    """Every process under root (root included): label, parent, CPU seconds, threads."""
    stats = {int(p): s for p in os.listdir("/proc") if p.isdigit() and (s := _stat(int(p))) is not None}
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _, _) in stats.items():
            if ppid == parent and pid not in tree:
                tree.add(pid)
                frontier.append(pid)
    return {"time": time.monotonic(), "processes": {
        str(pid): {"parent": stats[pid][0], "cpu": stats[pid][1], "threads": stats[pid][2], "label": _label(pid)}
        for pid in sorted(tree) if pid in stats}}


def diff(before: dict, after: dict) -> list[str]:  # type: ignore[type-arg]
    wall = after["time"] - before["time"]
    lines = [f"{wall:.1f} s wall; % of one core, busiest first"]
    rows = []
    for pid, p in after["processes"].items():
        earlier = before["processes"].get(pid, {"cpu": 0.0})
        rows.append((p["cpu"] - earlier["cpu"], pid, p))
    for cpu, pid, p in sorted(rows, key=lambda r: -r[0]):
        lines.append(f"  {100 * cpu / wall:6.1f}%  pid {pid} (parent {p['parent']}, {p['threads']} threads) "
                     f"{p['label']}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("snapshot")
    s.add_argument("root", type=int)
    d = sub.add_parser("diff")
    d.add_argument("before", type=Path)
    d.add_argument("after", type=Path)
    a = ap.parse_args()
    if a.command == "snapshot":
        json.dump(snapshot(a.root), sys.stdout)
    else:
        print("\n".join(diff(json.loads(a.before.read_text()), json.loads(a.after.read_text()))))


if __name__ == "__main__":
    main()
