"""Speculative decoding's Prometheus counters, with vLLM's names and meanings, and only where it is on."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from osserve.engine.core.outputs import EngineStats
from osserve.server.metrics import ServerMetrics


def samples(stats: EngineStats) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = ServerMetrics(lambda: stats, "m").render().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_spec_decode_counters() -> None:
    on = samples(EngineStats(spec_num_drafts=10, spec_num_draft_tokens=30, spec_num_accepted_tokens=14,
                             spec_accepted_per_position=[8, 4, 2]))
    model = (("model_name", "m"),)
    assert on[("osserve:spec_decode_num_drafts_total", model)] == 10
    assert on[("osserve:spec_decode_num_draft_tokens_total", model)] == 30
    assert on[("osserve:spec_decode_num_accepted_tokens_total", model)] == 14
    per_pos = {dict(labels)["position"]: v for (name, labels), v in on.items()
               if name == "osserve:spec_decode_num_accepted_tokens_per_pos_total"}
    assert per_pos == {"0": 8, "1": 4, "2": 2}
    off = samples(EngineStats())
    assert not any("spec_decode" in name for name, _ in off)
