"""The Databricks error shape: {"error_code": "...", "message": "..."}.

Owns: `DatabricksErrors`, the shape registered for the Databricks surface, which also claims
requests no view answered under /serving-endpoints/ and /api/2.0/; the one mapping of an
error to Databricks' `error_code` (a code that is already Databricks', the error's kind, or
its status). A message names the field at fault when it does not already. Imports msgspec,
api.http.shared and runtime.
"""

from __future__ import annotations

from typing import Any

import msgspec

from api.http.shared.errors import ErrorShape, HTTPError
from runtime.errors import EngineDead, InvalidRequest, ModelNotFound, Overloaded, ServingError

PREFIXES = ("/serving-endpoints/", "/api/2.0/")
_BY_STATUS = {
    400: "BAD_REQUEST", 401: "UNAUTHENTICATED", 404: "ENDPOINT_NOT_FOUND", 405: "BAD_REQUEST", 408: "BAD_REQUEST",
    413: "BAD_REQUEST", 429: "REQUEST_LIMIT_EXCEEDED", 500: "INTERNAL_ERROR", 503: "TEMPORARILY_UNAVAILABLE",
}


class DatabricksError(msgspec.Struct):
    error_code: str
    message: str


def error_code(exc: ServingError) -> str:
    if exc.code and exc.code.isupper():
        return exc.code
    if isinstance(exc, HTTPError):
        return _BY_STATUS.get(exc.status, "INTERNAL_ERROR" if exc.status >= 500 else "BAD_REQUEST")
    if isinstance(exc, InvalidRequest):
        return "MALFORMED_REQUEST" if exc.code == "invalid_json" else "INVALID_PARAMETER_VALUE"
    if isinstance(exc, ModelNotFound):
        return "RESOURCE_DOES_NOT_EXIST"
    if isinstance(exc, Overloaded):
        return "REQUEST_LIMIT_EXCEEDED"
    if isinstance(exc, EngineDead):
        return "TEMPORARILY_UNAVAILABLE"
    return "INTERNAL_ERROR"


class DatabricksErrors(ErrorShape):
    name = "databricks"
    schema = DatabricksError

    def claims(self, path: str, query: bytes | str) -> bool:
        return path.startswith(PREFIXES)

    def body(self, exc: ServingError, status: int) -> tuple[Any, dict[str, str]]:
        message = str(exc)
        if exc.param and exc.param not in message:
            message = f"{message} (field: {exc.param})"
        return {"error_code": error_code(exc), "message": message}, {}
