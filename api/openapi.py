"""GET /openapi.json: the server's OpenAPI 3.1 document, generated, never hand-written.

Owns: building the document from the app's own URL map (every route it serves, with its
methods and path parameters) and the msgspec request structs (`msgspec.json.schema_components`
emits JSON Schema 2020-12, which OpenAPI 3.1 uses as is). A POST route's body schema is the
struct its view passes to `decode_body`, found by looking at the names the view's code uses,
so a new route is published with no edit here; `register_body` covers views that decode
some other way. Imports msgspec, quart and api.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import msgspec
from quart import Quart

from api.errors import json_response

REQUEST_BODIES: dict[str, type] = {}  # explicit entries win over what introspection finds

_PARAM = re.compile(r"<(?:[a-z]+:)?([A-Za-z_][A-Za-z0-9_]*)>")
_HIDDEN = {"static"}


class ErrorDetail(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(msgspec.Struct):
    error: ErrorDetail


def register_body(path: str, schema: type) -> None:
    """Publish `schema` as the JSON request body of POST `path`."""
    REQUEST_BODIES[path] = schema


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
    routes = [(rule.rule, sorted(rule.methods - {"HEAD", "OPTIONS"}), rule.endpoint) for rule in app.url_map.iter_rules()]
    routes = [r for r in routes if r[2] not in _HIDDEN]
    bodies: dict[str, type] = {}
    for rule, methods, endpoint in routes:
        schema = REQUEST_BODIES.get(rule) or body_schema(app.view_functions[endpoint])
        if "POST" in methods and schema is not None:
            bodies[rule] = schema
    body_paths = sorted(bodies)
    types = [bodies[p] for p in body_paths] + [ErrorResponse]
    refs, components = msgspec.json.schema_components(types, ref_template="#/components/schemas/{name}")
    body_refs = dict(zip(body_paths, refs))
    error_ref = refs[-1]

    paths: dict[str, dict[str, Any]] = {}
    for rule, methods, endpoint in sorted(routes):
        path = _PARAM.sub(r"{\1}", rule)
        for method in methods:
            op: dict[str, Any] = {
                "operationId": f"{endpoint}_{method.lower()}".replace(".", "_"),
                "responses": _responses(rule, method, error_ref),
            }
            params = _PARAM.findall(rule)
            if params:
                op["parameters"] = [{"name": p, "in": "path", "required": True, "schema": {"type": "string"}} for p in params]
            if method == "POST" and rule in body_refs:
                op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body_refs[rule]}}}
            paths.setdefault(path, {})[method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "Switchyard", "version": _version(), "description": "OpenAI-compatible LLM serving."},
        "paths": paths,
        "components": {"schemas": components},
    }


def _responses(rule: str, method: str, error_ref: dict[str, Any]) -> dict[str, Any]:
    error = {"content": {"application/json": {"schema": error_ref}}}
    ok: dict[str, Any] = {"description": "OK"}
    if rule == "/metrics":
        ok["content"] = {"text/plain": {"schema": {"type": "string"}}}
    elif method == "POST" and rule.startswith("/v1/"):
        ok["content"] = {"application/json": {"schema": {"type": "object"}}, "text/event-stream": {"schema": {"type": "string"}}}
    else:
        ok["content"] = {"application/json": {"schema": {"type": "object"}}}
    out: dict[str, Any] = {"200": ok}
    if method == "POST":
        out["400"] = {"description": "Invalid request", **error}
        out["429"] = {"description": "Overloaded: retry after the Retry-After header's seconds", **error}
    if "<" in rule or method == "POST":
        out["404"] = {"description": "Unknown model", **error}
    out["503"] = {"description": "Engine unavailable or shutting down", **error}
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
