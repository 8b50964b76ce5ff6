"""Prometheus metrics with vLLM's names under the `osserve:` prefix, so a vLLM Grafana user finds
`osserve:num_requests_running`, `osserve:time_to_first_token_seconds`, ... Each app has its own
registry (no global state). Engine gauges are read at scrape time; latencies are observed as
requests finish.

With several HTTP processes (server/api_servers.py), prometheus_client's multiprocess mode keeps
each process's latencies and counts in files under PROMETHEUS_MULTIPROC_DIR (the library reads
that variable when imported: the supervisor sets it for its server processes), and a scrape,
whichever process it reaches, sums them all."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from osserve.engine.core.outputs import EngineStats

# prometheus_client's multiprocess directory, read when the library is imported: set in the
# environment a server process starts with (server/api_servers.py).
METRICS_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                   7.5, 10.0, 20.0, 40.0, 80.0)


class _EngineCollector(Collector):
    def __init__(self, stats: Callable[[], EngineStats], model: str) -> None:
        self.stats, self.model = stats, model

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        s = self.stats()
        labels = ["model_name"]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(f"osserve:{name}", doc, labels=labels)
            g.add_metric([self.model], value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(f"osserve:{name}", doc, labels=labels)
            c.add_metric([self.model], value)
            return c

        yield gauge("num_requests_running", "Requests in the running batch.", s.num_running)
        yield gauge("num_requests_waiting", "Requests waiting to be scheduled.", s.num_waiting)
        yield gauge("kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0-1).", s.kv_cache_usage)
        yield counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                      s.prefix_cache_queries)
        yield counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.", s.prefix_cache_hits)
        yield counter("prompt_tokens", "Prompt tokens computed.", s.prompt_tokens_total)
        yield counter("generation_tokens", "Tokens generated.", s.generation_tokens_total)
        yield counter("num_preemptions", "Requests preempted for lack of KV blocks.", s.num_preemptions)
        if s.spec_accepted_per_position is not None:  # speculative decoding is on (vLLM's names and meanings)
            yield counter("spec_decode_num_drafts", "Drafts verified (one per request per speculative step).",
                          s.spec_num_drafts)
            yield counter("spec_decode_num_draft_tokens", "Draft tokens verified.", s.spec_num_draft_tokens)
            yield counter("spec_decode_num_accepted_tokens", "Draft tokens accepted.", s.spec_num_accepted_tokens)
            per_pos = CounterMetricFamily("osserve:spec_decode_num_accepted_tokens_per_pos",
                                          "Draft tokens accepted, by position in the draft (0-based).",
                                          labels=["model_name", "position"])
            for position, accepted in enumerate(s.spec_accepted_per_position):
                per_pos.add_metric([self.model, str(position)], accepted)
            yield per_pos


class ServerMetrics:
    def __init__(self, stats: Callable[[], EngineStats], model: str) -> None:
        self.model = model
        self.registry = CollectorRegistry()
        self.engine = _EngineCollector(stats, model)
        self.registry.register(self.engine)
        self.shared_dir = os.environ.get(METRICS_DIR_VARIABLE)
        labels = ["model_name"]

        def hist(name: str, doc: str) -> Histogram:
            return Histogram(f"osserve:{name}", doc, labels, buckets=LATENCY_BUCKETS, registry=self.registry)

        self.ttft = hist("time_to_first_token_seconds", "Time to first token.")
        self.itl = hist("inter_token_latency_seconds", "Time between output tokens.")
        self.itl_of_model = self.itl.labels(model)  # observed once per token: the label looked up once
        self.e2e = hist("e2e_request_latency_seconds", "End-to-end request latency.")
        self.queue = hist("request_queue_time_seconds", "Time waiting before first scheduled.")
        self.success = Counter("osserve:request_success", "Finished requests by finish reason.",
                               ["model_name", "finished_reason"], registry=self.registry)

    def observe_itl(self, seconds: float) -> None:
        """One inter-token latency, as it happens: observed at a request's end instead, a serving
        wave's 256 ends were ~32k observations at once on the HTTP process's thread."""
        self.itl_of_model.observe(seconds)

    def observe_request(self, ttft: float | None, e2e: float, queue: float | None,
                        finish_reason: str | None) -> None:
        if ttft is not None:
            self.ttft.labels(self.model).observe(ttft)
        self.e2e.labels(self.model).observe(e2e)
        if queue is not None:
            self.queue.labels(self.model).observe(queue)
        self.success.labels(self.model, finish_reason or "unknown").inc()

    def render(self) -> bytes:
        if self.shared_dir is None:
            return generate_latest(self.registry)
        every_process = CollectorRegistry()  # the histograms and counters of every server process
        MultiProcessCollector(every_process, self.shared_dir)
        every_process.register(self.engine)  # the same in each: read here
        return generate_latest(every_process)
