"""Errors as JSON in the OpenAI shape: {"error": {"message", "type", "param", "code"}}.

Owns: mapping `runtime.errors` and msgspec decode errors (whose JSON path becomes `param`)
to status codes and bodies, and `surface_error`: an error raised before any route ran (a 401,
a rate limit, a shed request, an unknown route) in the shape of the API surface the request
addressed: Azure ML (seed 003) for Azure's routes or any request carrying `api-version`,
Databricks for /serving-endpoints/ and /api/2.0/, OpenAI for the rest.
Imports msgspec, quart and runtime.
"""

from __future__ import annotations

import re

import msgspec
from quart import Response

from runtime.errors import InvalidRequest, Overloaded, ServingError

# Databricks' error_code and OpenAI's (type, code) for the statuses raised outside a route.
_DATABRICKS_CODES = {
    400: "BAD_REQUEST", 401: "UNAUTHENTICATED", 404: "ENDPOINT_NOT_FOUND", 405: "BAD_REQUEST", 408: "BAD_REQUEST",
    413: "BAD_REQUEST", 429: "REQUEST_LIMIT_EXCEEDED", 500: "INTERNAL_ERROR", 503: "TEMPORARILY_UNAVAILABLE",
}
_OPENAI = {
    401: ("invalid_request_error", "invalid_api_key"), 404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"), 408: ("invalid_request_error", "timeout"),
    413: ("invalid_request_error", "body_too_large"), 429: ("rate_limit_error", "rate_limit_exceeded"),
    500: ("server_error", None), 503: ("server_error", "engine_unavailable"),
}

_PATH = re.compile(r" - at `\$\.?(.*)`$")
_MISSING = re.compile(r"missing required field `([^`]+)`")


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def json_response(body: object, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(msgspec.json.encode(body), status=status, headers=headers, content_type="application/json")


def from_decode_error(exc: msgspec.DecodeError) -> InvalidRequest:
    """A msgspec error → InvalidRequest whose param is the JSON path of the bad field."""
    text = str(exc)
    if not isinstance(exc, msgspec.ValidationError):
        return InvalidRequest(f"The request body is not valid JSON: {text}", param=None, code="invalid_json")
    param = None
    if (m := _PATH.search(text)) is not None:
        param = m.group(1) or None
    if (m := _MISSING.search(text)) is not None:
        param = f"{param}.{m.group(1)}" if param else m.group(1)
    return InvalidRequest(f"Invalid request: {text}", param=param, code="invalid_value")


def error_response(exc: ServingError) -> Response:
    headers = {}
    if isinstance(exc, Overloaded):
        headers["Retry-After"] = str(max(1, round(exc.retry_after)))
    return json_response(error_body(str(exc), exc.type, exc.param, exc.code), exc.status, headers)


def surface_error(
    path: str, status: int, message: str, query: bytes | str = b"", code: str | None = None
) -> tuple[dict, dict[str, str]]:
    """(body, extra headers) of an error on `path`, in the shape of that path's API surface.
    `code` replaces the OpenAI `code` (e.g. "overloaded" for a shed request)."""
    from api.azure.routes import azure_error, is_azure

    if is_azure(path, query):
        return azure_error(status, message)
    if path.startswith(("/serving-endpoints/", "/api/2.0/")):
        return {"error_code": _DATABRICKS_CODES.get(status, "INTERNAL_ERROR" if status >= 500 else "BAD_REQUEST"), "message": message}, {}
    type_, default_code = _OPENAI.get(status, ("server_error" if status >= 500 else "invalid_request_error", None))
    return error_body(message, type_, None, code or default_code), {}
