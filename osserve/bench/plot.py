"""PNG plots of a serving run (latency distributions, throughput over time) and of a sweep."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from osserve.bench.stats import RequestRecord  # noqa: E402


def plot_run(records: list[RequestRecord], duration: float, path: str, title: str) -> None:
    ok = [r for r in records if r.ok]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    series = [
        ("TTFT (ms)", [1000 * r.ttft for r in ok if r.ttft is not None]),
        ("ITL (ms)", [1000 * x for r in ok for x in r.itl]),
        ("end-to-end latency (s)", [r.latency for r in ok if r.latency is not None]),
    ]
    for ax, (name, values) in zip(axes.flat[:3], series, strict=True):
        ax.hist(values or [0], bins=50, color="#3b6ea8")
        ax.set_title(name)
        ax.set_ylabel("count")
    bins = max(1, int(duration) + 1)
    counts = [0] * bins
    for r in ok:  # each streamed chunk counted as output at its arrival second
        for t in r.chunk_times:
            counts[min(bins - 1, int(t))] += 1
    ax = axes.flat[3]
    ax.plot(range(bins), counts, color="#a83b3b")
    ax.set_title("streamed chunks per second")
    ax.set_xlabel("time (s)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_sweep(points: list[dict[str, Any]], path: str, title: str) -> None:
    """Output throughput against TTFT p50, one point per concurrency."""
    fig, ax = plt.subplots(figsize=(7, 5))
    xs = [p["summary"]["ttft_ms"]["p50"] for p in points]
    ys = [p["summary"]["output_throughput"] for p in points]
    ax.plot(xs, ys, marker="o")
    for p, x, y in zip(points, xs, ys, strict=True):
        ax.annotate(f"c={p['concurrency']}", (x, y), textcoords="offset points", xytext=(5, 5))
    ax.set_xlabel("TTFT p50 (ms)")
    ax.set_ylabel("output tokens/s")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
