"""GET /metrics: Prometheus text exposition of the server's `ServerMetrics` (runtime/metrics.py)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST
from quart import Quart, Response

from runtime.metrics import ServerMetrics


def register(app: Quart, metrics: ServerMetrics) -> None:
    @app.get("/metrics")
    async def metrics_route():  # type: ignore[no-untyped-def]
        return Response(metrics.exposition(), content_type=CONTENT_TYPE_LATEST)
