"""The one list of the server's routes.

Owns: `ROUTES`, every path the server answers, with its method, the surface whose errors and
documentation it takes, and what the edge must know before the app reads a body: whether a
model runs (load shedding, token rate limits, a streamed response in OpenAPI), which header
names the model, and which query parameter must hold one of a set of values. Surfaces bind
their views to these routes by name (`bind`); `check_bound` refuses an app whose views and
table disagree. The edge's metrics labels, api/http/shared/admission.py, api/http/shared/auth.py and
api/http/shared/openapi.py read the table, so a path is written once. Also `Handler`: a request
format served by one surface that another reuses (Azure ML and Databricks answer the OpenAI
chat format), handed over by create_app so that surfaces never import each other.
Imports quart and werkzeug.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from quart import Quart, Response
from werkzeug.exceptions import HTTPException
from werkzeug.routing import Map, Rule

# Azure ML's api-version values (its chat completions reference's, and the azure-ai-inference
# SDK's default).
AZURE_API_VERSIONS = ("2024-04-01-preview", "2024-05-01-preview")


@dataclass(frozen=True, slots=True)
class Route:
    name: str  # the view's endpoint name (and the OpenAPI operationId's stem)
    method: str
    path: str  # as werkzeug spells it: /serving-endpoints/<name>/invocations
    surface: str | None  # "openai", "azure", "databricks"; None: the server's own
    # A model runs: "generate" or "embed" (runtimes of that task can take it), or "endpoint"
    # (the endpoint its <name> names decides).
    runs: str | None = None
    model_header: str | None = None  # a header that names the served model
    query: tuple[str, tuple[str, ...]] | None = None  # (parameter, its allowed values): required
    open: bool = False  # answered without an API key


ROUTES: tuple[Route, ...] = (
    Route("chat_completions", "POST", "/v1/chat/completions", "openai", runs="generate"),
    Route("completions", "POST", "/v1/completions", "openai", runs="generate"),
    Route("create_response", "POST", "/v1/responses", "openai", runs="generate"),
    Route("embeddings", "POST", "/v1/embeddings", "openai", runs="embed"),
    Route("list_models", "GET", "/v1/models", "openai"),
    Route("get_model", "GET", "/v1/models/<path:model_id>", "openai"),
    Route("load_lora_adapter", "POST", "/v1/load_lora_adapter", "openai"),
    Route("unload_lora_adapter", "POST", "/v1/unload_lora_adapter", "openai"),
    Route(
        "azure_chat_completions", "POST", "/chat/completions", "azure", runs="generate",
        model_header="azureml-model-deployment", query=("api-version", AZURE_API_VERSIONS),
    ),
    Route("azure_model_info", "GET", "/info", "azure", model_header="azureml-model-deployment", query=("api-version", AZURE_API_VERSIONS)),
    Route("invocations", "POST", "/serving-endpoints/<name>/invocations", "databricks", runs="endpoint"),
    # Databricks' OpenAI-compatible paths: the body's `model` names the endpoint.
    Route("databricks_chat_completions", "POST", "/serving-endpoints/chat/completions", "databricks", runs="endpoint"),
    Route("databricks_completions", "POST", "/serving-endpoints/completions", "databricks", runs="endpoint"),
    Route("databricks_embeddings", "POST", "/serving-endpoints/embeddings", "databricks", runs="endpoint"),
    Route("create_endpoint", "POST", "/api/2.0/serving-endpoints", "databricks"),
    Route("list_endpoints", "GET", "/api/2.0/serving-endpoints", "databricks"),
    Route("get_endpoint", "GET", "/api/2.0/serving-endpoints/<name>", "databricks"),
    Route("update_config", "PUT", "/api/2.0/serving-endpoints/<name>/config", "databricks"),
    Route("delete_endpoint", "DELETE", "/api/2.0/serving-endpoints/<name>", "databricks"),
    Route("health", "GET", "/health", None, open=True),
    Route("metrics_route", "GET", "/metrics", None, open=True),
    Route("openapi", "GET", "/openapi.json", None),
)
ROUTES_BY_NAME = {route.name: route for route in ROUTES}
OPEN_PATHS = frozenset(route.path for route in ROUTES if route.open)

_MAP = Map([Rule(route.path, endpoint=route.name, methods=[route.method]) for route in ROUTES])
_ADAPTER = _MAP.bind("localhost")

View = Callable[..., Awaitable[Response]]


class Handler(NamedTuple):
    """A request format: the struct its body decodes into, and what answers a decoded one."""

    schema: type
    respond: Callable[[Any, Any], Awaitable[Response]]  # (ModelRegistry, request struct)


def match(method: str, path: str) -> tuple[Route, dict[str, Any]] | None:
    """The route `method path` takes, with its path arguments; None when there is none."""
    try:
        name, args = _ADAPTER.match(path, method=method)
    except HTTPException:  # NotFound, MethodNotAllowed, a redirect
        return None
    return ROUTES_BY_NAME[name], dict(args)


def template(method: str, path: str) -> str | None:
    """The template of the route `method path` takes, else of one its path has under another
    method (a POST-only path asked with GET still names its route); None: no route has it."""
    found = match(method, path)
    if found is None:
        others = sorted({route.method for route in ROUTES} - {method})
        found = next((m for m in (match(other, path) for other in others) if m is not None), None)
    return found[0].path if found is not None else None


def bind(
    app: Quart, name: str, view: View, body: type | tuple[type, ...] | None = None, params: list[dict[str, Any]] | None = None
) -> None:
    """Serve route `name` with `view`. For the OpenAPI document: `body`, the struct (or any of
    the structs) its JSON body decodes into; `params`, parameters the surface documents beyond
    those the table implies (OpenAPI parameter objects)."""
    route = ROUTES_BY_NAME[name]
    app.add_url_rule(route.path, route.name, view, methods=[route.method])
    if body is not None:
        app.extensions.setdefault("route_bodies", {})[name] = body
    if params:
        app.extensions.setdefault("route_params", {})[name] = params


def check_bound(app: Quart) -> None:
    """Every route in the table has a view, and every view a route (else: not a server)."""
    bound = {rule.endpoint for rule in app.url_map.iter_rules() if rule.endpoint != "static"}
    missing, extra = set(ROUTES_BY_NAME) - bound, bound - set(ROUTES_BY_NAME)
    if missing or extra:
        raise RuntimeError(f"routes without a view: {sorted(missing)}; views without a route in api/http/shared/routes.py: {sorted(extra)}")
