"""Per-request records → the summary the peers print (vLLM's benchmark_serving layout).

Percentiles use numpy's default 'linear' interpolation. TPOT of a request is
(e2e − TTFT) / (output tokens − 1); ITL is every gap between content-bearing chunks. The first
event is the response's first SSE event of any kind (loadgen.py says what it marks).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np


@dataclass
class RequestRecord:
    start: float  # seconds since the run began
    ttft: float | None = None
    first_event: float | None = None  # seconds to the response's first SSE event, text or not
    itl: list[float] = field(default_factory=list)
    latency: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0  # from the server's usage, not counted here
    error: str | None = None
    chunk_times: list[float] = field(default_factory=list)  # seconds since the run began

    @property
    def ok(self) -> bool:
        return self.error is None


def _pcts(values: list[float], scale: float = 1000.0) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
    a = np.asarray(values, dtype=np.float64) * scale
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99))}


def summarize(records: list[RequestRecord], duration: float) -> dict[str, Any]:
    ok = [r for r in records if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    tpots = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok
             if r.latency is not None and r.ttft is not None and r.output_tokens > 1]
    return {
        "duration_s": duration,
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "request_throughput": len(ok) / duration if duration > 0 else 0.0,
        "output_throughput": out_tokens / duration if duration > 0 else 0.0,
        "total_token_throughput": (in_tokens + out_tokens) / duration if duration > 0 else 0.0,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "ttft_ms": _pcts([r.ttft for r in ok if r.ttft is not None]),
        "first_event_ms": _pcts([r.first_event for r in ok if r.first_event is not None]),
        "tpot_ms": _pcts(tpots),
        "itl_ms": _pcts([x for r in ok for x in r.itl]),
        "e2el_ms": _pcts([r.latency for r in ok if r.latency is not None]),
        "errors": sorted({r.error for r in records if r.error})[:10],
    }


def records_json(records: list[RequestRecord]) -> list[dict[str, Any]]:
    return [asdict(r) for r in records]
