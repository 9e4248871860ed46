"""GET /v1/models and /v1/models/{id}."""

from __future__ import annotations

from quart import Quart

from api.errors import json_response
from runtime.engine import Runtime
from runtime.errors import ModelNotFound
from runtime.registry import ModelRegistry


def model_card(runtime: Runtime) -> dict:
    return {
        "id": runtime.served_name,
        "object": "model",
        "created": runtime.created,
        "owned_by": "switchyard",
        "max_model_len": runtime.max_model_len,
        "model_impl": (runtime.info.impl or None) if runtime.info else None,  # native[+int4...] | transformers
    }


def register(app: Quart, models: ModelRegistry) -> None:
    @app.get("/v1/models")
    async def list_models():  # type: ignore[no-untyped-def]
        return json_response({"object": "list", "data": [model_card(r) for r in models]})

    @app.get("/v1/models/<path:model_id>")
    async def get_model(model_id: str):  # type: ignore[no-untyped-def]
        for runtime in models:
            if runtime.served_name == model_id:
                return json_response(model_card(runtime))
        raise ModelNotFound(model_id)
