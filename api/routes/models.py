"""GET /v1/models and /v1/models/{id}."""

from __future__ import annotations

from quart import Quart

from api.errors import json_response
from runtime.engine import Runtime
from runtime.errors import ModelNotFound


def register(app: Quart, runtime: Runtime) -> None:
    def card() -> dict:
        return {
            "id": runtime.served_name,
            "object": "model",
            "created": runtime.created,
            "owned_by": "switchyard",
            "max_model_len": runtime.max_model_len,
        }

    @app.get("/v1/models")
    async def list_models():  # type: ignore[no-untyped-def]
        return json_response({"object": "list", "data": [card()]})

    @app.get("/v1/models/<path:model_id>")
    async def get_model(model_id: str):  # type: ignore[no-untyped-def]
        if model_id != runtime.served_name:
            raise ModelNotFound(model_id)
        return json_response(card())
