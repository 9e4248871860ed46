"""GET /v1/models and /v1/models/{id}."""

from __future__ import annotations

from quart import Quart, Response

from api.http.shared.errors import json_response
from api.http.shared.routes import bind
from runtime.errors import ModelNotFound
from runtime.protocol import Runtime
from runtime.registry import ModelRegistry


def model_card(runtime: Runtime) -> dict[str, object]:
    return {
        "id": runtime.served_name,
        "object": "model",
        "created": runtime.created,
        "owned_by": "switchyard",
        "max_model_len": runtime.max_model_len,
        "model_impl": (runtime.info.impl or None) if runtime.info else None,  # native[+int4...] | transformers
    }


def register(app: Quart, models: ModelRegistry) -> None:
    async def list_models() -> Response:
        return json_response({"object": "list", "data": [model_card(r) for r in models]})

    async def get_model(model_id: str) -> Response:
        for runtime in models:
            if runtime.served_name == model_id:
                return json_response(model_card(runtime))
        raise ModelNotFound(model_id)

    bind(app, "list_models", list_models)
    bind(app, "get_model", get_model)
