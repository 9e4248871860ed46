"""Errors as JSON, each in the shape of the API surface it answers for: the one mechanism.

Owns: `ErrorShape` (how one surface writes an error: its status, body and headers for any
`ServingError`, and the msgspec struct of its body, which OpenAPI publishes), `ErrorShapes`
(the registry every surface registers its shape with; create_app fills it) and `HTTPError`,
an error raised outside any view (401, 404, 405, 408, 413, a rate limit, 500), which goes
through the same shapes. Which shape answers:
- an error a view raised: the shape of the surface that owns the view's route (api/http/shared/routes.py);
- an error raised before or outside any view: the first registered shape that claims the
  request's path and query (Azure ML claims its paths and any `api-version` request,
  Databricks /serving-endpoints/ and /api/2.0/), else the default one (OpenAI's).
Every shape gets `Retry-After` on an Overloaded. Also: `install` (the app's error handlers)
and `ErrorShapes.send` (answering from ASGI middleware, before the app). Imports quart,
werkzeug, msgspec, api.http.shared.routes and runtime; never a surface.
"""

from __future__ import annotations

from typing import Any

import msgspec
from quart import Quart, Response, request
from werkzeug.exceptions import HTTPException

from api.http.shared.routes import ROUTES_BY_NAME
from runtime.errors import Overloaded, ServingError
from runtime.logging import get_logger

log = get_logger("api")


class HTTPError(ServingError):
    """An error the HTTP layer answers itself, before or around the views."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class ErrorShape:
    """How one API surface writes errors. A surface subclasses it and registers an instance."""

    name = ""
    schema: type[msgspec.Struct]  # the error body, as OpenAPI documents it
    doc_headers: dict[str, Any] = {}  # headers its errors carry, as OpenAPI documents them
    doc_statuses: dict[str, dict[str, str]] = {}  # method -> status -> description, beyond the common ones

    def claims(self, path: str, query: bytes | str) -> bool:
        """Whether a request no view answered belongs to this surface."""
        return False

    def status(self, exc: ServingError) -> int:
        return exc.status if exc.status >= 400 else 500

    def body(self, exc: ServingError, status: int) -> tuple[Any, dict[str, str]]:
        """(JSON body, extra headers)."""
        raise NotImplementedError

    def not_found(self, method: str, path: str) -> str:
        return f"No route {method} {path}."


class ErrorShapes:
    """The registered shapes; `default` answers what no other shape claims."""

    def __init__(self, default: ErrorShape) -> None:
        self.default = default
        self.shapes: dict[str, ErrorShape] = {default.name: default}

    def register(self, shape: ErrorShape) -> None:
        self.shapes[shape.name] = shape

    def named(self, name: str | None) -> ErrorShape:
        return self.shapes.get(name or "", self.default)

    def claiming(self, path: str, query: bytes | str = b"") -> ErrorShape:
        for shape in self.shapes.values():
            if shape is not self.default and shape.claims(path, query):
                return shape
        return self.default

    def render(self, shape: ErrorShape, exc: ServingError, headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
        """(status, encoded body, headers) of `exc` in `shape`."""
        status = shape.status(exc)
        body, extra = shape.body(exc, status)
        out = {**(headers or {}), **extra}
        if isinstance(exc, Overloaded):
            out["Retry-After"] = str(max(1, round(exc.retry_after)))
        return status, msgspec.json.encode(body), out

    def response(self, shape: ErrorShape, exc: ServingError, headers: dict[str, str] | None = None) -> Response:
        status, raw, out = self.render(shape, exc, headers)
        return Response(raw, status=status, headers=out, content_type="application/json")

    async def send(self, send: Any, scope: dict[str, Any], exc: ServingError, headers: dict[str, str] | None = None) -> None:
        """Answer from ASGI middleware (no app, no view) in the shape the request's path claims."""
        shape = self.claiming(scope.get("path", ""), scope.get("query_string", b""))
        status, raw, out = self.render(shape, exc, headers)
        header_list = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
        header_list += [(k.lower().encode(), v.encode()) for k, v in out.items()]
        await send({"type": "http.response.start", "status": status, "headers": header_list})
        await send({"type": "http.response.body", "body": raw, "more_body": False})


def json_response(body: object, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(msgspec.json.encode(body), status=status, headers=headers, content_type="application/json")


def install(app: Quart, shapes: ErrorShapes, max_body_bytes: int) -> None:
    """The app's error handlers: a view's ServingError in its route's surface shape, and
    unknown routes, wrong methods, oversized bodies and anything unexpected in the shape of
    the surface the request's path addresses."""

    def outside(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
        shape = shapes.claiming(request.path, request.query_string)
        return shapes.response(shape, HTTPError(status, message), headers)

    @app.errorhandler(ServingError)
    async def _serving_error(exc: ServingError) -> Response:
        route = ROUTES_BY_NAME.get(request.url_rule.endpoint) if request.url_rule is not None else None
        return shapes.response(shapes.named(route.surface if route is not None else None), exc)

    @app.errorhandler(404)
    async def _not_found(exc: Exception) -> Response:
        shape = shapes.claiming(request.path, request.query_string)
        return shapes.response(shape, HTTPError(404, shape.not_found(request.method, request.path)))

    @app.errorhandler(405)
    async def _not_allowed(exc: Exception) -> Response:
        allowed = sorted(set(getattr(exc, "valid_methods", None) or ()) - {"OPTIONS", "HEAD"})
        use = f"; use {', '.join(allowed)}" if allowed else ""
        headers = {"Allow": ", ".join(allowed)} if allowed else {}
        return outside(405, f"{request.method} is not allowed on {request.path}{use}.", headers)

    @app.errorhandler(413)
    async def _too_large(exc: Exception) -> Response:
        return outside(413, f"The request body is larger than {max_body_bytes} bytes.")

    @app.errorhandler(Exception)
    async def _unexpected(exc: Exception) -> Response:
        if isinstance(exc, HTTPException):
            return outside(exc.code or 400, exc.description or exc.name)
        log.exception("unhandled_error", path=request.path)
        return outside(500, "Internal server error.")
