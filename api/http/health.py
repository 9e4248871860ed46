"""GET /health: 200 while the engine can serve, 503 otherwise (not merely "the process is up")."""

from __future__ import annotations

from quart import Quart

from api.http.errors import json_response
from runtime.registry import ModelRegistry


def register(app: Quart, models: ModelRegistry) -> None:
    @app.get("/health")
    async def health():  # type: ignore[no-untyped-def]
        ok, reason = models.health()
        return json_response({"status": "ok" if ok else "unhealthy", "reason": reason}, 200 if ok else 503)
