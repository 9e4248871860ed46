"""The platform surface, wired into an app in one call: `install(app, models, config)`.

Owns the wiring of api/auth.py (API keys and rate limits, as ASGI middleware around the app),
api/databricks.py (serving endpoints, their SQLite store loaded before serving) and
api/routes/azure.py. `create_app` calls it before wrapping the app in the edge middleware, so
the edge (request ids, access log, metrics) also sees the 401s and 429s. Imports quart and api.
"""

from __future__ import annotations

from quart import Quart

from api import databricks, openapi
from api.auth import AuthMiddleware
from api.endpoints_store import EndpointStore
from api.platform_config import PlatformConfig
from api.routes import azure
from api.schemas import ChatCompletionRequest
from api.serving_endpoints import CreateEndpointRequest, ServingEndpoints
from runtime.logging import get_logger
from runtime.registry import ModelRegistry

log = get_logger("platform")


def install(app: Quart, models: ModelRegistry, config: PlatformConfig | None = None) -> None:
    config = config if config is not None else PlatformConfig.from_env()
    endpoints = ServingEndpoints(models, EndpointStore(config.endpoints_db))
    app.extensions["platform_config"] = config
    app.extensions["serving_endpoints"] = endpoints
    databricks.register(app, models, endpoints)
    azure.register(app, models)
    openapi.register_body("/chat/completions", ChatCompletionRequest)
    openapi.register_body("/api/2.0/serving-endpoints", CreateEndpointRequest)

    @app.before_serving
    async def _load_endpoints() -> None:
        await endpoints.load()

    app.asgi_app = AuthMiddleware(app.asgi_app, config)  # type: ignore[method-assign]
    log.info("platform", api_keys=len(config.api_keys), requests_per_minute=config.requests_per_minute,
             tokens_per_minute=config.tokens_per_minute, endpoints_db=str(config.endpoints_db))
