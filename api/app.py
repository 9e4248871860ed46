"""`create_app(runtime)`: the Quart-Trio application.

Owns: app configuration (no response timeout: a long stream must never be cut, ANCHORS E2),
body decoding with msgspec, the error handlers that turn any `ServingError` into the API's
error JSON (and unknown routes, wrong methods, oversized bodies into the error shape of the
surface the request addressed: Azure's for Azure's paths or any `api-version` request), route
registration, and the ASGI stack, outermost first:

    BodyDrain (a response sent before the body was read: read the rest, or close the connection)
      -> EdgeMiddleware (request id, access log, metrics)
        -> AuthMiddleware (API key, then load shedding via api.edge.Admission, then rate limits)
          -> the Quart app (routing, body decoding, handlers)

Imports quart/quart_trio, msgspec, api and runtime.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
from quart import current_app, request
from quart_trio import QuartTrio

from api.body_drain import BodyDrain
from api.edge import Admission, EdgeMiddleware, note_model, note_route
from api.errors import error_response, from_decode_error, json_response, surface_error
from runtime.metrics import ServerMetrics
from runtime.registry import ModelRegistry
from runtime.errors import ServingError
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
    admission = app.extensions["admission"] = Admission(models)
    platform.install(app, models, platform_config, admission)  # auth, shedding, rate limits, Databricks, Azure
    app.asgi_app = EdgeMiddleware(app.asgi_app, metrics, models, app.url_map)  # type: ignore[method-assign]
    app.asgi_app = BodyDrain(app.asgi_app, MAX_BODY_BYTES)  # type: ignore[method-assign]

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
        from api.routes.azure import is_azure

        message = f"No route {request.method} {request.path}."
        if is_azure(request.path, request.query_string):  # seed 003: "route not supported by the model"
            message = f"The route {request.method} {request.path} is not supported by this deployment; its routes are POST /chat/completions and GET /info."
        return _surface_error(404, message)

    @app.errorhandler(405)
    async def _not_allowed(exc: Exception):  # type: ignore[no-untyped-def]
        allowed = sorted(set(getattr(exc, "valid_methods", None) or ()) - {"OPTIONS", "HEAD"})
        use = f"; use {', '.join(allowed)}" if allowed else ""
        headers = {"Allow": ", ".join(allowed)} if allowed else {}
        return _surface_error(405, f"{request.method} is not allowed on {request.path}{use}.", headers)

    @app.errorhandler(413)
    async def _too_large(exc: Exception):  # type: ignore[no-untyped-def]
        return _surface_error(413, f"The request body is larger than {MAX_BODY_BYTES} bytes.")

    @app.errorhandler(Exception)
    async def _unexpected(exc: Exception):  # type: ignore[no-untyped-def]
        from werkzeug.exceptions import HTTPException

        if isinstance(exc, HTTPException):
            return _surface_error(exc.code or 400, exc.description or exc.name)
        log.exception("unhandled_error", path=request.path)
        return _surface_error(500, "Internal server error.")

    for module in (chat, completions, embeddings, responses, models_routes, health):
        module.register(app, models)
    metrics_routes.register(app, metrics)
    openapi.register(app)
    return app


def _surface_error(status: int, message: str, headers: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    """An error raised outside a view, in the shape of the surface the request addressed."""
    body, extra = surface_error(request.path, status, message, request.query_string)
    return json_response(body, status, {**(headers or {}), **extra})


def _log_output(ctx: Any, finish: Any, now: float) -> None:
    """--log-prompts only: the generated text, once per finished request."""
    log.info("request_output", request_id=ctx.request_id, text=getattr(ctx.detok, "text", None))
