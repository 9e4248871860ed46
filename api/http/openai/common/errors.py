"""The OpenAI error shape: {"error": {"message", "type", "param", "code"}}.

Owns: `OpenAIErrors`, the shape registered for the OpenAI surface and the default of every
request no other surface claims (api/http/shared/errors.py), with the type and code of errors the
HTTP layer raises itself (401, 404, 405, 408, 413, 429, 500), and `error_body` (an
`ErrorResponse`), which a stream also sends as its error event. Imports msgspec,
api.http.shared and runtime.
"""

from __future__ import annotations

from typing import Any

import msgspec

from api.http.shared.errors import ErrorShape, HTTPError
from runtime.errors import ServingError

# (type, code) of the statuses the HTTP layer answers itself.
_BY_STATUS = {
    401: ("invalid_request_error", "invalid_api_key"), 404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"), 408: ("invalid_request_error", "timeout"),
    413: ("invalid_request_error", "body_too_large"), 429: ("rate_limit_error", "rate_limit_exceeded"),
    500: ("server_error", None), 503: ("server_error", "engine_unavailable"),
}


class ErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(msgspec.Struct):
    error: ErrorDetail


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> ErrorResponse:
    return ErrorResponse(ErrorDetail(message, type_, param, code))


class OpenAIErrors(ErrorShape):
    name = "openai"
    schema = ErrorResponse

    def body(self, exc: ServingError, status: int) -> tuple[Any, dict[str, str]]:
        if isinstance(exc, HTTPError):
            type_, code = _BY_STATUS.get(status, ("server_error" if status >= 500 else "invalid_request_error", None))
            return error_body(str(exc), type_, None, exc.code or code), {}
        return error_body(str(exc), exc.type, exc.param, exc.code), {}
