"""The platform surface, wired into an app in one call: `install(app, models, config, admission)`.

Owns the wiring of api/auth.py (API keys, load shedding through api.edge.Admission, rate
limits, as ASGI middleware around the app), api/databricks.py (serving endpoints, their SQLite
store loaded before serving, then the endpoints the config file declares applied over it) and
api/routes/azure.py. `create_app` calls it before wrapping the app in the edge middleware, so
the edge (request ids, access log, metrics) also sees the 401s and 429s.

Endpoints declared in the config file (`PlatformConfig.endpoints`, [[endpoints]] tables) are
checked against the served models here, at once (a bad table stops the server before it
listens), and applied when serving starts: created when missing, replaced when the stored
definition differs (config_version + 1), left alone when equal. They stay ordinary endpoints
afterwards: the management API may change them until the next start applies the file again.
Imports quart and api.
"""

from __future__ import annotations

from typing import Any

from quart import Quart

from api import databricks, openapi
from api.auth import AuthMiddleware
from api.endpoints_store import EndpointStore
from api.platform_config import PlatformConfig
from api.routes import azure
from api.schemas import ChatCompletionRequest, CompletionRequest
from api.serving_endpoints import CreateEndpointRequest, EndpointConfigInput, ServingEndpoints
from runtime.logging import get_logger
from runtime.registry import ModelRegistry

log = get_logger("platform")


def install(app: Quart, models: ModelRegistry, config: PlatformConfig | None = None, admission: Any = None) -> None:
    from api.routes.embeddings import EmbeddingRequest

    config = config if config is not None else PlatformConfig.from_env()
    endpoints = ServingEndpoints(models, config.endpoint_store or EndpointStore(config.endpoints_db))
    declared = endpoints.check_declared(config.endpoints)  # raises ValueError naming the table
    app.extensions["platform_config"] = config
    app.extensions["serving_endpoints"] = endpoints
    if admission is not None:
        admission.endpoints = endpoints
    databricks.register(app, models, endpoints)
    azure.register(app, models)
    openapi.register_body("/chat/completions", ChatCompletionRequest)
    openapi.register_body("/api/2.0/serving-endpoints", CreateEndpointRequest)
    openapi.register_body("/api/2.0/serving-endpoints/<name>/config", EndpointConfigInput, method="PUT")
    openapi.register_body("/serving-endpoints/<name>/invocations", (ChatCompletionRequest, CompletionRequest, EmbeddingRequest))

    @app.before_serving
    async def _load_endpoints() -> None:
        await endpoints.load()
        await endpoints.apply_declared(declared)

    app.asgi_app = AuthMiddleware(app.asgi_app, config, admission=admission)  # type: ignore[method-assign]
    log.info("platform", api_keys=len(config.api_keys), requests_per_minute=config.requests_per_minute,
             tokens_per_minute=config.tokens_per_minute, endpoints_db=str(config.endpoints_db),
             declared_endpoints=[e.name for e in config.endpoints])
