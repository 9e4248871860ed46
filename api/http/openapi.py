"""GET /openapi.json: the server's OpenAPI 3.1 document, generated, never hand-written.

Owns: building the document from the app's own URL map (every route it serves, with its
methods and path parameters) and the msgspec request structs (`msgspec.json.schema_components`
emits JSON Schema 2020-12, which OpenAPI 3.1 uses as is). A POST route's body schema is the
struct its view passes to `decode_body`, found by looking at the names the view's code uses,
so a new route is published with no edit here; `register_body` covers views that decode
some other way (a PUT, or a body that is one of several structs: `anyOf`).

Also published: the Bearer security scheme (every operation but /health and /metrics needs it
when the server has keys; 401 documented on each), 429 on every protected operation (rate
limits; and overload on generation routes), Azure's `api-version` query parameter and its
`extra-parameters` / `azureml-model-deployment` headers on Azure's routes, and each surface's
own error body (OpenAI, Azure ML with `x-ms-error-code`, Databricks). Imports msgspec, quart
and api.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import msgspec
from quart import Quart

from api.http.auth import OPEN_PATHS
from api.http.edge import runs_model
from api.http.errors import json_response

# (method, rule) -> a struct, or a tuple of structs (anyOf); entries win over introspection
REQUEST_BODIES: dict[tuple[str, str], type | tuple[type, ...]] = {}
SECURITY_SCHEME = "bearerAuth"

_PARAM = re.compile(r"<(?:[a-z]+:)?([A-Za-z_][A-Za-z0-9_]*)>")
_HIDDEN = {"static"}


class ErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(msgspec.Struct):
    error: ErrorDetail


class AzureErrorDetail(msgspec.Struct):
    loc: list[str]
    value: str


class AzureError(msgspec.Struct, kw_only=True):
    """Seed 003's UnauthorizedError / NotFoundError / TooManyRequestsError, and
    UnprocessableContentError (with `code` and `detail`)."""

    error: str
    message: str
    status: int
    code: str | None = None
    detail: list[AzureErrorDetail] | None = None


class DatabricksError(msgspec.Struct):
    error_code: str
    message: str


def register_body(path: str, schema: type | tuple[type, ...], method: str = "POST") -> None:
    """Publish `schema` (or any of a tuple of schemas) as the JSON request body of `method path`
    (`path` as the app's rule spells it, e.g. /api/2.0/serving-endpoints/<name>/config)."""
    REQUEST_BODIES[(method.upper(), path)] = schema


def body_schema(view: Callable[..., Any]) -> type | None:
    """The msgspec struct a view decodes its body into: the one Struct class among the globals
    it names, when it calls `decode_body` (api/app.py, the one place routes decode bodies)."""
    fn = inspect.unwrap(view)
    code = getattr(fn, "__code__", None)
    if code is None or "decode_body" not in code.co_names:
        return None
    found = {fn.__globals__.get(name) for name in code.co_names}
    structs = [o for o in found if isinstance(o, type) and issubclass(o, msgspec.Struct)]
    return structs[0] if len(structs) == 1 else None


def build_document(app: Quart) -> dict[str, Any]:
    from api.azure.routes import API_VERSIONS, AZURE_PATHS, EXTRA_MODES

    routes = [(rule.rule, sorted(rule.methods - {"HEAD", "OPTIONS"}), rule.endpoint) for rule in app.url_map.iter_rules()]
    routes = [r for r in routes if r[2] not in _HIDDEN]
    bodies: dict[tuple[str, str], tuple[type, ...]] = {}
    for rule, methods, endpoint in routes:
        for method in methods:
            schema = REQUEST_BODIES.get((method, rule))
            if schema is None and method == "POST":
                schema = body_schema(app.view_functions[endpoint])
            if schema is not None:
                bodies[(method, rule)] = schema if isinstance(schema, tuple) else (schema,)
    body_keys = sorted(bodies)
    types: list[Any] = [t for key in body_keys for t in bodies[key]] + [ErrorResponse, AzureError, DatabricksError]
    refs, components = msgspec.json.schema_components(types, ref_template="#/components/schemas/{name}")
    body_refs: dict[tuple[str, str], dict[str, Any]] = {}
    i = 0
    for key in body_keys:
        group = refs[i : i + len(bodies[key])]
        i += len(group)
        body_refs[key] = group[0] if len(group) == 1 else {"anyOf": list(group)}
    error_refs = {"openai": refs[-3], "azure": refs[-2], "databricks": refs[-1]}

    paths: dict[str, dict[str, Any]] = {}
    for rule, methods, endpoint in sorted(routes):
        path = _PARAM.sub(r"{\1}", rule)
        azure = rule in AZURE_PATHS
        surface = "azure" if azure else "databricks" if rule.startswith(("/serving-endpoints/", "/api/2.0/")) else "openai"
        for method in methods:
            op: dict[str, Any] = {
                "operationId": f"{endpoint}_{method.lower()}".replace(".", "_"),
                "responses": _responses(rule, method, error_refs[surface], azure),
            }
            params: list[dict[str, Any]] = [
                {"name": p, "in": "path", "required": True, "schema": {"type": "string"}} for p in _PARAM.findall(rule)
            ]
            if azure:
                params += [
                    {"name": "api-version", "in": "query", "required": True, "description": "Azure API version.",
                     "schema": {"type": "string", "enum": list(API_VERSIONS)}},
                    {"name": "azureml-model-deployment", "in": "header", "required": False,
                     "description": "The served model (deployment) to route to; default: the body's model, else the default chat model.",
                     "schema": {"type": "string"}},
                ]
                if method == "POST":
                    params.append({
                        "name": "extra-parameters", "in": "header", "required": False,
                        "description": "What happens to body fields outside Azure's request table: pass-through (to the engine), ignore (dropped), error (400; the default).",
                        "schema": {"type": "string", "enum": list(EXTRA_MODES), "default": "error"},
                    })
            if params:
                op["parameters"] = params
            if (method, rule) in body_refs:
                op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body_refs[(method, rule)]}}}
            if rule in OPEN_PATHS:
                op["security"] = []  # open even on a server with API keys
            paths.setdefault(path, {})[method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "Switchyard", "version": _version(), "description": "OpenAI-compatible LLM serving, with Databricks serving endpoints and the Azure ML chat route."},
        "security": [{SECURITY_SCHEME: []}],
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                SECURITY_SCHEME: {
                    "type": "http", "scheme": "bearer",
                    "description": "Authorization: Bearer <key>, when the server is configured with API keys (none: an open server).",
                }
            },
        },
    }


def _responses(rule: str, method: str, error_ref: dict[str, Any], azure: bool = False) -> dict[str, Any]:
    def error(description: str) -> dict[str, Any]:
        out: dict[str, Any] = {"description": description, "content": {"application/json": {"schema": error_ref}}}
        if azure:
            out["headers"] = {"x-ms-error-code": {"description": "The error's code, e.g. Unauthorized, NotFound, UnprocessableContent, TooManyRequests.", "schema": {"type": "string"}}}
        return out

    ok: dict[str, Any] = {"description": "OK"}
    if rule == "/metrics":
        ok["content"] = {"text/plain": {"schema": {"type": "string"}}}
    elif method == "POST" and runs_model(rule):
        ok["content"] = {"application/json": {"schema": {"type": "object"}}, "text/event-stream": {"schema": {"type": "string"}}}
    else:
        ok["content"] = {"application/json": {"schema": {"type": "object"}}}
    out: dict[str, Any] = {"200": ok}
    if method in ("POST", "PUT") or azure:
        out["400"] = error("Invalid request" + (" (or a missing / unsupported api-version)" if azure else ""))
    if rule not in OPEN_PATHS:
        out["401"] = error("Missing or invalid API key (servers configured with keys)")
    if "<" in rule or method == "POST" or azure:
        out["404"] = error("Unknown model, endpoint or deployment" + (", or a route the model does not support" if azure else ""))
    if azure and method == "POST":
        out["422"] = error("Unprocessable content: detail[] names each field (loc) and its value")
    if rule not in OPEN_PATHS:
        out["429"] = error("Rate limit reached, or (generation routes) every request slot taken: retry after the Retry-After header's seconds")
    out["503"] = error("Engine unavailable or shutting down")
    return out


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("switchyard")
    except Exception:  # not installed (running from a checkout)
        return "0"


def register(app: Quart) -> None:
    cache: dict[str, bytes] = {}

    @app.get("/openapi.json")
    async def openapi():  # type: ignore[no-untyped-def]
        # Built on first request, when every route (including late-registered ones) exists.
        if "doc" not in cache:
            cache["doc"] = msgspec.json.encode(build_document(app))
        return json_response(msgspec.Raw(cache["doc"]))
