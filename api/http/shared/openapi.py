"""GET /openapi.json: the server's OpenAPI 3.1 document, generated, never hand-written.

Owns: building the document from the one route table (api/http/shared/routes.py: every route, its
methods, path parameters, required query parameter and model header), the request structs
the surfaces bound to their routes (`msgspec.json.schema_components` emits JSON Schema
2020-12, which OpenAPI 3.1 uses as is; a body that is one of several structs is an `anyOf`),
the extra parameters they documented, and each surface's registered error shape (its body
struct, the headers its errors carry, the statuses only it answers).

Also published: the Bearer security scheme (every operation but the open routes needs it
when the server has keys; 401 documented on each), 429 on every protected operation (rate
limits; and overload on routes that run a model). Imports msgspec, quart and api.http.shared.
"""

from __future__ import annotations

import importlib.metadata
import re
from typing import Any

import msgspec
from quart import Quart

from api.http.shared.errors import ErrorShape, ErrorShapes
from api.http.shared.routes import ROUTES, Route

SECURITY_SCHEME = "bearerAuth"

_PARAM = re.compile(r"<(?:[a-z]+:)?([A-Za-z_][A-Za-z0-9_]*)>")


def build_document(app: Quart) -> dict[str, Any]:
    shapes: ErrorShapes = app.extensions["error_shapes"]
    bodies: dict[str, type | tuple[type, ...]] = app.extensions.get("route_bodies", {})
    documented = [route for route in ROUTES if route.name in app.view_functions]
    groups = {name: body if isinstance(body, tuple) else (body,) for name, body in bodies.items()}
    names = sorted(groups)
    errors = list(shapes.shapes.values())
    types: list[Any] = [t for name in names for t in groups[name]] + [shape.schema for shape in errors]
    refs, components = msgspec.json.schema_components(types, ref_template="#/components/schemas/{name}")
    body_refs: dict[str, dict[str, Any]] = {}
    i = 0
    for name in names:
        group = refs[i : i + len(groups[name])]
        i += len(group)
        body_refs[name] = group[0] if len(group) == 1 else {"anyOf": list(group)}
    error_refs = {shape.name: ref for shape, ref in zip(errors, refs[i:])}
    extra_params: dict[str, list[dict[str, Any]]] = app.extensions.get("route_params", {})
    paths: dict[str, dict[str, Any]] = {}
    for route in sorted(documented, key=lambda r: (r.path, r.method)):
        shape = shapes.named(route.surface)
        op: dict[str, Any] = {
            "operationId": f"{route.name}_{route.method.lower()}",
            "responses": _responses(route, shape, error_refs[shape.name]),
        }
        params = _parameters(route) + extra_params.get(route.name, [])
        if params:
            op["parameters"] = params
        if route.name in body_refs:
            op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body_refs[route.name]}}}
        if route.open:
            op["security"] = []  # open even on a server with API keys
        paths.setdefault(_PARAM.sub(r"{\1}", route.path), {})[route.method.lower()] = op
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


def _parameters(route: Route) -> list[dict[str, Any]]:
    params: list[dict[str, Any]] = [
        {"name": p, "in": "path", "required": True, "schema": {"type": "string"}} for p in _PARAM.findall(route.path)
    ]
    if route.query is not None:
        name, values = route.query
        params.append({"name": name, "in": "query", "required": True, "description": f"Required: one of the supported {name} values.",
                       "schema": {"type": "string", "enum": list(values)}})
    if route.model_header is not None:
        params.append({"name": route.model_header, "in": "header", "required": False,
                       "description": "The served model to route to; default: the body's model, else the default chat model.",
                       "schema": {"type": "string"}})
    return params


def _responses(route: Route, shape: ErrorShape, error_ref: dict[str, Any]) -> dict[str, Any]:
    def error(description: str) -> dict[str, Any]:
        out: dict[str, Any] = {"description": description, "content": {"application/json": {"schema": error_ref}}}
        if shape.doc_headers:
            out["headers"] = dict(shape.doc_headers)
        return out

    ok: dict[str, Any] = {"description": "OK"}
    if route.name == "metrics_route":
        ok["content"] = {"text/plain": {"schema": {"type": "string"}}}
    elif route.runs is not None:
        ok["content"] = {"application/json": {"schema": {"type": "object"}}, "text/event-stream": {"schema": {"type": "string"}}}
    else:
        ok["content"] = {"application/json": {"schema": {"type": "object"}}}
    out: dict[str, Any] = {"200": ok}
    if route.method in ("POST", "PUT") or route.query is not None:
        out["400"] = error("Invalid request" + (f" (or a missing / unsupported {route.query[0]})" if route.query else ""))
    if not route.open:
        out["401"] = error("Missing or invalid API key (servers configured with keys)")
    if "<" in route.path or route.method == "POST" or route.query is not None:
        out["404"] = error("Unknown model, endpoint or deployment")
    for status, description in shape.doc_statuses.get(route.method, {}).items():
        out[status] = error(description)
    if not route.open:
        out["429"] = error("Rate limit reached, or (routes that run a model) every request slot taken: retry after the Retry-After header's seconds")
    out["503"] = error("Engine unavailable or shutting down")
    return dict(sorted(out.items()))


def _version() -> str:
    try:
        return importlib.metadata.version("switchyard")
    except importlib.metadata.PackageNotFoundError:  # running from a checkout
        return "0"
