"""One /metrics view over several front ends (runtime/metrics_merge.py): counters and histograms
add up series by series, the engine's gauges are the first process's (every front end hears the
same counters), a front end's own request gauges add up, and a series one process alone has is
kept; the result parses as Prometheus text."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from runtime.metrics_merge import merge_expositions


def _exposition(finished: dict[str, int], running: int, live: int, step_ms: list[float]) -> bytes:
    r = CollectorRegistry()
    counter = Counter("switchyard_requests_finished", "Requests that finished.", ["model", "finish_reason"], registry=r)
    for reason, n in finished.items():
        counter.labels("tiny", reason).inc(n)
    Gauge("switchyard_requests_running", "Running.", ["model"], registry=r).labels("tiny").set(running)
    Gauge("switchyard_requests_live", "Live.", ["model"], registry=r).labels("tiny").set(live)
    hist = Histogram("switchyard_step_seconds", "Steps.", ["model"], buckets=(0.001, 0.01), registry=r)
    for ms in step_ms:
        hist.labels("tiny").observe(ms / 1e3)
    return generate_latest(r)


def test_counters_and_histograms_add_up_engine_gauges_come_from_the_first() -> None:
    parent = _exposition({"length": 3, "stop": 1}, running=5, live=2, step_ms=[0.5, 5.0])
    other = _exposition({"length": 4}, running=5, live=3, step_ms=[])
    third = _exposition({"abort": 2}, running=5, live=0, step_ms=[])
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(merge_expositions([parent, other, third]).decode())
        for s in family.samples
    }
    assert samples[("switchyard_requests_finished_total", (("finish_reason", "length"), ("model", "tiny")))] == 7
    assert samples[("switchyard_requests_finished_total", (("finish_reason", "stop"), ("model", "tiny")))] == 1
    assert samples[("switchyard_requests_finished_total", (("finish_reason", "abort"), ("model", "tiny")))] == 2  # one process's alone
    assert samples[("switchyard_requests_running", (("model", "tiny"),))] == 5  # the engine's, not 15
    assert samples[("switchyard_requests_live", (("model", "tiny"),))] == 5  # each front end's own, added
    assert samples[("switchyard_step_seconds_count", (("model", "tiny"),))] == 2
    assert samples[("switchyard_step_seconds_bucket", (("le", "0.001"), ("model", "tiny")))] == 1
