"""`create_app(runtime)`: the Quart-Trio application.

Owns: app configuration (no response timeout: a long stream must never be cut, ANCHORS E2),
body decoding with msgspec, the error handlers that turn any `ServingError` into the API's
error JSON, and route registration. Imports quart/quart_trio, msgspec, api and runtime.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
from quart import current_app, request
from quart_trio import QuartTrio

from api.edge import EdgeMiddleware, note_model, note_route
from api.errors import error_body, error_response, from_decode_error, json_response
from runtime.metrics import ServerMetrics
from runtime.registry import ModelRegistry
from runtime.errors import InvalidRequest, ServingError
from runtime.logging import get_logger

log = get_logger("api")
T = TypeVar("T")

MAX_BODY_BYTES = 32 * 1024 * 1024


_decoders: dict[type, msgspec.json.Decoder] = {}


async def decode_body(schema: type[T]) -> T:
    body = await request.get_data(cache=False)
    decoder = _decoders.get(schema)
    if decoder is None:
        decoder = _decoders[schema] = msgspec.json.Decoder(schema)
    if current_app.config.get("LOG_PROMPTS"):  # --log-prompts only: bodies hold user data
        log.info("request_body", body=body[:8192].decode(errors="replace"))
    try:
        decoded = decoder.decode(body)
    except msgspec.DecodeError as exc:
        raise from_decode_error(exc) from None
    model = getattr(decoded, "model", None)
    note_model(model if isinstance(model, str) else None)
    return decoded


def create_app(models: ModelRegistry, platform_config: Any = None) -> QuartTrio:
    """`platform_config`: an api.platform_config.PlatformConfig (keys, limits, state dir); None: from the environment."""
    from api import openapi, platform
    from api.routes import chat, completions, embeddings, health, responses
    from api.routes import metrics as metrics_routes
    from api.routes import models as models_routes

    app = QuartTrio("switchyard")
    app.config["RESPONSE_TIMEOUT"] = None
    app.config["BODY_TIMEOUT"] = 60
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.extensions["models"] = models
    metrics = app.extensions["metrics"] = ServerMetrics(models)
    app.config["LOG_PROMPTS"] = any(runtime.config.log_prompts for runtime in models)
    if app.config["LOG_PROMPTS"]:
        for runtime in models:
            runtime.on_finish.append(_log_output)
    platform.install(app, models, platform_config)  # auth + rate limits, Databricks, Azure
    app.asgi_app = EdgeMiddleware(app.asgi_app, metrics, models)  # type: ignore[method-assign]

    @app.before_request
    async def _note_route() -> None:
        note_route(request.url_rule.rule if request.url_rule is not None else None)

    @app.before_serving
    async def _start_watchdog() -> None:
        app.add_background_task(metrics.watch_event_loop)

    @app.after_serving
    async def _stop_watchdog() -> None:
        metrics.stop_watching()

    @app.errorhandler(ServingError)
    async def _serving_error(exc: ServingError):  # type: ignore[no-untyped-def]
        return error_response(exc)

    @app.errorhandler(404)
    async def _not_found(exc: Exception):  # type: ignore[no-untyped-def]
        return json_response(error_body(f"No route {request.method} {request.path}.", "invalid_request_error", None, "not_found"), 404)

    @app.errorhandler(405)
    async def _not_allowed(exc: Exception):  # type: ignore[no-untyped-def]
        return json_response(error_body(f"{request.method} is not allowed on {request.path}.", "invalid_request_error", None, "method_not_allowed"), 405)

    @app.errorhandler(413)
    async def _too_large(exc: Exception):  # type: ignore[no-untyped-def]
        return error_response(InvalidRequest(f"The request body is larger than {MAX_BODY_BYTES} bytes.", code="body_too_large"))

    @app.errorhandler(Exception)
    async def _unexpected(exc: Exception):  # type: ignore[no-untyped-def]
        from werkzeug.exceptions import HTTPException

        if isinstance(exc, HTTPException):
            return json_response(error_body(exc.description or exc.name, "invalid_request_error", None, None), exc.code or 400)
        log.exception("unhandled_error", path=request.path)
        return json_response(error_body("Internal server error.", "server_error", None, None), 500)

    for module in (chat, completions, embeddings, responses, models_routes, health):
        module.register(app, models)
    metrics_routes.register(app, metrics)
    openapi.register(app)
    return app


def _log_output(ctx: Any, finish: Any, now: float) -> None:
    """--log-prompts only: the generated text, once per finished request."""
    log.info("request_output", request_id=ctx.request_id, text=getattr(ctx.detok, "text", None))
