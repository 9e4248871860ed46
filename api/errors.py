"""Errors as JSON in the OpenAI shape: {"error": {"message", "type", "param", "code"}}.

Owns: mapping `runtime.errors` and msgspec decode errors (whose JSON path becomes `param`)
to status codes and bodies. Imports msgspec, quart and runtime.
"""

from __future__ import annotations

import re

import msgspec
from quart import Response

from runtime.errors import InvalidRequest, Overloaded, ServingError

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
