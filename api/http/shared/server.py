"""The server's own routes: GET /health, GET /metrics, GET /openapi.json.

/health is 200 while every engine can serve, 503 otherwise (not merely "the process is up");
/metrics is the Prometheus text exposition of `ServerMetrics` (runtime/metrics.py), or, with
several front ends, every process's merged (the platform's `metrics_view`);
/openapi.json is built on its first request (api/http/shared/openapi.py), once every route exists.
Imports prometheus_client, quart, msgspec, api.http.shared and runtime.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST
from quart import Quart, Response

from api.http.shared.errors import json_response
from api.http.shared.openapi import build_document
from api.http.shared.routes import bind
from runtime.metrics import ServerMetrics
from runtime.registry import ModelRegistry


def register(app: Quart, models: ModelRegistry, metrics: ServerMetrics, view: Callable[[], Awaitable[bytes]] | None = None) -> None:
    cache: dict[str, bytes] = {}

    async def health() -> Response:
        ok, reason = models.health()
        return json_response({"status": "ok" if ok else "unhealthy", "reason": reason}, 200 if ok else 503)

    async def metrics_route() -> Response:
        return Response(metrics.exposition() if view is None else await view(), content_type=CONTENT_TYPE_LATEST)

    async def openapi() -> Response:
        if "doc" not in cache:
            cache["doc"] = msgspec.json.encode(build_document(app))
        return json_response(msgspec.Raw(cache["doc"]))

    bind(app, "health", health)
    bind(app, "metrics_route", metrics_route)
    bind(app, "openapi", openapi)
