"""The Azure ML error shape (Azure Machine Learning chat completions): {"error", "message",
"status"}, plus "code" and
"detail": [{"loc", "value"}] on a 422, and the `x-ms-error-code` header on every error.

Owns: `AzureErrors`, the shape registered for the Azure surface, which also claims every
request no view answered that belongs to Azure (its paths, or any path called with an
`api-version` query parameter: how Azure clients address every route), so a 401, a rate
limit, a shed request, an unknown route or a wrong method takes this shape too;
`AzureRequestError` (an error with Azure's own status and detail entries) and `detail`, which
names a body field by its location and value. Imports msgspec, api.http.shared and runtime.
"""

from __future__ import annotations

import re
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qsl

import msgspec

from api.http.shared.errors import ErrorShape
from runtime.errors import InvalidRequest, ServingError

# The Azure AI model inference routes: errors on these paths are Azure's, whatever the query.
AZURE_PATHS = frozenset({"/chat/completions", "/info", "/embeddings", "/images/embeddings", "/completions"})
_CODES = {400: "BadRequest", 401: "Unauthorized", 404: "NotFound", 408: "RequestTimeout", 413: "PayloadTooLarge",
          422: "UnprocessableContent", 429: "TooManyRequests", 500: "InternalServerError", 503: "ServiceUnavailable"}
_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


class AzureErrorDetail(msgspec.Struct):
    loc: list[str]
    value: str


class AzureError(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Azure ML chat completions' UnauthorizedError / NotFoundError / TooManyRequestsError,
    and UnprocessableContentError (with `code` and `detail`)."""

    error: str
    message: str
    status: int
    code: str | None = None
    detail: list[AzureErrorDetail] | None = None


class AzureRequestError(ServingError):
    """An error with Azure's status and optional detail entries ({"loc": [...], "value": ...})."""

    def __init__(self, status: int, message: str, detail: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail


def is_azure(path: str, query: bytes | str = b"") -> bool:
    """Whether a request belongs to the Azure surface: one of Azure's paths, or any path
    called with an `api-version` query parameter."""
    if path in AZURE_PATHS:
        return True
    if isinstance(query, bytes):
        query = query.decode("latin-1")
    return "api-version" in query and any(k == "api-version" for k, _ in parse_qsl(query, keep_blank_values=True))


class AzureErrors(ErrorShape):
    name = "azure"
    schema = AzureError
    doc_headers = {"x-ms-error-code": {"description": "The error's code, e.g. Unauthorized, NotFound, UnprocessableContent, TooManyRequests.", "schema": {"type": "string"}}}
    doc_statuses = {"POST": {"422": "Unprocessable content: detail[] names each field (loc) and its value"}}

    def claims(self, path: str, query: bytes | str) -> bool:
        return is_azure(path, query)

    def status(self, exc: ServingError) -> int:
        if isinstance(exc, InvalidRequest):
            return 400 if exc.code == "invalid_json" else 422  # the payload parses but cannot be served
        return exc.status if exc.status >= 400 else 500

    def body(self, exc: ServingError, status: int) -> tuple[Any, dict[str, str]]:
        code = _CODES.get(status) or HTTPStatus(status).phrase.replace(" ", "")
        body: dict[str, Any] = {"error": HTTPStatus(status).phrase, "message": str(exc), "status": status}
        detail = exc.detail if isinstance(exc, AzureRequestError) else None
        if detail is not None or status == 422:
            body["code"] = code
            body["detail"] = detail or []
        return body, {"x-ms-error-code": code}

    def not_found(self, method: str, path: str) -> str:
        # Azure ML chat completions: "route not supported by the model"
        return f"The route {method} {path} is not supported by this deployment; its routes are POST /chat/completions and GET /info."


def with_detail(exc: ServingError, fields: Any) -> ServingError:
    """A view's error in Azure's terms: an InvalidRequest about a body that parsed is a 422
    whose detail names the field and the value it had."""
    if isinstance(exc, InvalidRequest) and exc.code != "invalid_json" and exc.param:
        return AzureRequestError(422, str(exc), detail(fields, exc.param))
    return exc


def detail(fields: Any, *params: str) -> list[dict[str, Any]]:
    return [{"loc": ["body", *_loc(p)], "value": _value_at(fields, _loc(p))} for p in params]


def _loc(param: str) -> list[str]:
    return [a or b for a, b in _STEP.findall(param)]


def _value_at(fields: Any, loc: list[str]) -> str:
    value = fields
    for step in loc:
        if isinstance(value, dict) and step in value:
            value = value[step]
        elif isinstance(value, list) and step.isdigit() and int(step) < len(value):
            value = value[int(step)]
        else:
            return ""
    return value if isinstance(value, str) else msgspec.json.encode(value).decode()
