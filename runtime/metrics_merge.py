"""One `/metrics` view over several front-end processes (`--api-servers`): their expositions merged.

Owns the rule: counters and histograms (what each front end saw of its own requests and, in the
parent's only, of the engine's steps) add up sample by sample; a gauge is the first process's
(the parent's: the engine's counters, which every front end hears alike, and its event loop),
except those that count each front end's own requests, which add up too. A family or a series
only one process has is taken as it is. Text in, text out (Prometheus' text format, parsed and
written by prometheus_client). Imports prometheus_client only.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

# Gauges of a front end's own admitted requests (runtime/metrics.py `_RuntimeGauges`).
SUMMED_GAUGES = frozenset({"switchyard_requests_live", "switchyard_pending_tokens"})
_ADDED = frozenset({"counter", "histogram", "summary"})


def merge_expositions(texts: list[bytes]) -> bytes:
    """The expositions as one, the first one's gauges winning (see the module's docstring)."""
    families: dict[str, tuple[Metric, dict[tuple[str, tuple[tuple[str, str], ...]], float]]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text.decode()):
            known = families.get(family.name)
            if known is None:
                known = families[family.name] = (Metric(family.name, family.documentation, family.type), {})
            added = family.type in _ADDED or family.name in SUMMED_GAUGES
            values = known[1]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if key not in values:
                    values[key] = sample.value
                elif added:
                    values[key] += sample.value
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(families))
    return generate_latest(registry)


class _Merged:
    def __init__(self, families: dict[str, tuple[Metric, dict[tuple[str, tuple[tuple[str, str], ...]], float]]]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        for metric, values in self.families.values():
            for (name, labels), value in values.items():
                metric.add_sample(name, dict(labels), value)
            yield metric
