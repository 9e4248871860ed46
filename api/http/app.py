"""`create_app(models, platform_config)`: the Quart-Trio application, composed.

Owns: the app's configuration (no response timeout: a long stream must never be cut, and
Quart's default RESPONSE_TIMEOUT of 60 s ends any longer stream with a clean EOF, as if it were
done), and putting the pieces together, the one place that knows them all:
- the surfaces (api/http/openai, api/http/azure, api/http/databricks) bind their views to the route table
  (api/http/shared/routes.py) and register their error shapes (api/http/shared/errors.py); Azure ML and
  Databricks answer in the OpenAI formats they are handed here, so no surface imports another;
- the server's own routes (/health, /metrics, /openapi.json), then a check that every route
  in the table has its view;
- the ASGI stack, outermost first:

    BodyDrain (a response sent before the body was read: read the rest, or close the connection)
      -> EdgeMiddleware (request id, access log, metrics)
        -> AuthMiddleware (API key, then load shedding via Admission, then rate limits)
          -> the Quart app (routing, body decoding, handlers)

Imports quart_trio and api.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from quart import request
from quart_trio import QuartTrio

from api.http.azure import routes as azure
from api.http.azure.errors import AzureErrors
from api.http.databricks import routes as databricks
from api.http.databricks.endpoints import ServingEndpoints
from api.http.databricks.errors import DatabricksErrors
from api.http.databricks.store import EndpointStore
from api.http.openai import surface as openai
from api.http.platform.config import PlatformConfig
from api.http.shared import errors, server
from api.http.shared.admission import Admission
from api.http.shared.auth import AuthMiddleware
from api.http.shared.body_drain import BodyDrain
from api.http.shared.edge import EdgeMiddleware, note_route
from api.http.shared.routes import check_bound
from runtime.config import RuntimeConfig
from runtime.logging import get_logger
from runtime.metrics import ServerMetrics
from runtime.protocol import Runtime
from runtime.registry import ModelRegistry

log = get_logger("api")

MAX_BODY_BYTES = 32 * 1024 * 1024


def error_shapes() -> errors.ErrorShapes:
    """Every surface's error shape, OpenAI's the default: the app's, and a serve-ray ingress's
    for the errors it answers itself (api/cluster/ingress.py)."""
    shapes = errors.ErrorShapes(openai.ERRORS)
    shapes.register(AzureErrors())
    shapes.register(DatabricksErrors())
    return shapes


def build_app(
    configs: Sequence[RuntimeConfig], runtime_factory: Callable[[RuntimeConfig], Runtime], platform: PlatformConfig | None = None
) -> tuple[ModelRegistry, QuartTrio]:
    """(registry, app) for the served models: the one HTTP stack, shared by `switchyard serve`
    (on Hypercorn) and each `serve-ray` replica (api/cluster/host.py). `runtime_factory`
    makes each model's engine: the process layer passes `actors.build.build_engine`."""
    models = ModelRegistry([runtime_factory(c) for c in configs])
    return models, create_app(models, platform)


def create_app(models: ModelRegistry, platform_config: PlatformConfig | None = None) -> QuartTrio:
    """`platform_config`: keys, limits, state dir, declared endpoints; None: from the environment."""
    config = platform_config if platform_config is not None else PlatformConfig.from_env()
    app = _configured(models)
    metrics = app.extensions["metrics"] = ServerMetrics(models)
    shapes = app.extensions["error_shapes"] = error_shapes()
    endpoints = ServingEndpoints(models, config.endpoint_store or EndpointStore(config.endpoints_db))
    declared = endpoints.check_declared(config.endpoints)  # raises naming the table: before listening
    app.extensions["platform_config"] = config
    app.extensions["serving_endpoints"] = endpoints

    openai.register(app, models)
    azure.register(app, models, openai.HANDLERS["chat"])
    databricks.register(app, models, endpoints, openai.HANDLERS, declared)
    server.register(app, models, metrics, config.metrics_view)
    check_bound(app)
    errors.install(app, shapes, MAX_BODY_BYTES)

    admission = app.extensions["admission"] = Admission(models, endpoints, shapes)
    authed = AuthMiddleware(app.asgi_app, config, admission=admission, errors=shapes)
    app.asgi_app = BodyDrain(EdgeMiddleware(authed, metrics, models), MAX_BODY_BYTES)  # type: ignore[method-assign,assignment]
    log.info("platform", api_keys=len(config.api_keys), requests_per_minute=config.requests_per_minute,
             tokens_per_minute=config.tokens_per_minute, endpoints_db=str(config.endpoints_db),
             declared_endpoints=[e.name for e in config.endpoints])
    return app


def _configured(models: ModelRegistry) -> QuartTrio:
    """The bare app: its settings, prompt logging, the event-loop watchdog, route labels."""
    app = QuartTrio("switchyard")
    app.config["RESPONSE_TIMEOUT"] = None
    app.config["BODY_TIMEOUT"] = 60
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.extensions["models"] = models
    app.config["LOG_PROMPTS"] = any(runtime.config.log_prompts for runtime in models)
    if app.config["LOG_PROMPTS"]:
        for runtime in models:
            runtime.on_finish.append(_log_output)

    @app.before_request
    async def _note_route() -> None:
        note_route(request.url_rule.rule if request.url_rule is not None else None)

    @app.before_serving
    async def _start_watchdog() -> None:
        app.add_background_task(app.extensions["metrics"].watch_event_loop)

    @app.after_serving
    async def _stop_watchdog() -> None:
        app.extensions["metrics"].stop_watching()

    return app


def _log_output(ctx: Any, finish: Any, now: float) -> None:
    """--log-prompts only: the generated text, once per finished request."""
    log.info("request_output", request_id=ctx.request_id, text=getattr(ctx.detok, "text", None))
