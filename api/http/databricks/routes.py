"""Databricks model serving over HTTP: endpoint management and invocations (the Databricks
Foundation Model API).

Owns:
- `POST /serving-endpoints/{name}/invocations`: draws the endpoint's served entity by its
  traffic split, then dispatches by the endpoint's task and the body's shape (`messages`:
  chat, `prompt`: completions, `input`: embeddings) to the handler of that request format
  (the OpenAI surface's, handed over by create_app), with `model` set to the entity's served
  model. The response names the entity in the `served-model-name` header (what databricks-sdk
  reads into `QueryEndpointResponse.served_model_name`), and its `model` field is the served model;
- `POST /serving-endpoints/chat/completions`, `/completions` and `/embeddings`: Databricks'
  OpenAI-compatible paths, where the body's `model` names the endpoint (an OpenAI client with
  `base_url` `{host}/serving-endpoints`, as databricks-sdk's `get_open_ai_client` makes). The
  same invocation; the path, not the body's shape, says which request format it is;
- `/api/2.0/serving-endpoints` create, list, get, `PUT .../{name}/config` and delete, with
  Databricks' JSON (ServingEndpointDetailed; state READY / NOT_UPDATING, since changes apply
  at once);
- errors in Databricks' shape (api/http/databricks/errors.py).
The rules of endpoints live in api/http/databricks/endpoints.py, their storage in
api/http/databricks/store.py. Imports quart, msgspec, api.http.shared, api.http.databricks and runtime.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgspec
from quart import Quart, Response

from api.http.databricks.endpoints import TASKS, CreateEndpointRequest, Endpoint, EndpointConfigInput, ServedEntity, ServingEndpoints
from api.http.shared.body import decode, decode_object, read_body
from api.http.shared.edge import note_model
from api.http.shared.errors import json_response
from api.http.shared.routes import Handler, bind
from runtime.errors import InvalidRequest, ModelNotFound
from runtime.registry import ModelRegistry

TABULAR_FIELDS = ("dataframe_records", "dataframe_split", "instances", "inputs")
# Databricks' OpenAI-compatible paths: request format -> route name (api/http/shared/routes.py).
OPENAI_COMPATIBLE = {"chat": "databricks_chat_completions", "completions": "databricks_completions", "embeddings": "databricks_embeddings"}


# -- invocations ------------------------------------------------------------------------------


def _handler(handlers: Mapping[str, Handler], task: str, fields: dict[str, Any], endpoint: str) -> Handler:
    """The request format (chat, completions or embeddings) that serves this body."""
    kind = TASKS.get(task, task)
    if any(f in fields for f in TABULAR_FIELDS):
        raise InvalidRequest(f"Endpoint {endpoint!r} serves {kind}; tabular inputs ({', '.join(TABULAR_FIELDS)}) are for custom models.", param=next(f for f in TABULAR_FIELDS if f in fields))
    if task == "embed":
        if "input" not in fields:
            raise InvalidRequest(f"Endpoint {endpoint!r} serves {kind}: send `input`.", param="input")
        if "embeddings" not in handlers:
            raise InvalidRequest("This server cannot run embeddings yet.", param="input")
        return handlers["embeddings"]
    if "messages" in fields:
        return handlers["chat"]
    if "prompt" in fields:
        return handlers["completions"]
    param = "input" if "input" in fields else "messages"
    raise InvalidRequest(f"Endpoint {endpoint!r} serves {kind}: send `messages` (chat) or `prompt` (completions).", param=param)


def _fixed_handler(handlers: Mapping[str, Handler], task: str, kind: str, endpoint: str) -> Handler:
    """The request format an OpenAI-compatible path names, if the endpoint serves it."""
    if (task == "embed") != (kind == "embeddings"):
        path = "embeddings" if task == "embed" else "chat/completions"
        raise InvalidRequest(f"Endpoint {endpoint!r} serves {TASKS.get(task, task)}: send it to /serving-endpoints/{path}.", param="model")
    return handlers[kind]


async def invoke(
    endpoints: ServingEndpoints, models: ModelRegistry, handlers: Mapping[str, Handler], name: str, body: bytes,
    kind: str | None = None, fields: dict[str, Any] | None = None,
) -> Response:
    """One invocation of endpoint `name`; `kind`: the request format the path named (the
    OpenAI-compatible paths), else the body's shape decides; `fields`: the body, if decoded."""
    entity = endpoints.route(name)
    note_model(entity.model)
    task = _task_of(models, entity.model)
    fields = decode_object(body) if fields is None else fields
    handler = _fixed_handler(handlers, task, kind, name) if kind is not None else _handler(handlers, task, fields, name)
    req: msgspec.Struct = msgspec.structs.replace(decode(body, handler.schema), model=entity.model)
    response = await handler.respond(models, req)
    response.headers["served-model-name"] = entity.name
    return response


def _endpoint_named(schema: type) -> type:
    """`schema` as the OpenAI-compatible paths document it: `model` (the endpoint) required."""
    return msgspec.defstruct(f"Databricks{schema.__name__}", [("model", str)], bases=(schema,), kw_only=True)


def _task_of(models: ModelRegistry, name: str) -> str:
    for runtime in models.served():
        if runtime.served_name == name:
            return runtime.task
    raise ModelNotFound(name)


# -- management -------------------------------------------------------------------------------


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def endpoint_json(endpoints: ServingEndpoints, endpoint: Endpoint, detailed: bool = True) -> dict[str, Any]:
    served_names = {runtime.served_name for runtime in endpoints.models}
    entities, served_models = [], []
    for e in endpoint.served:
        state = {"deployment": "DEPLOYMENT_READY", "deployment_state_message": "Served."}
        if e.model not in served_names:
            state = {"deployment": "DEPLOYMENT_FAILED", "deployment_state_message": f"{e.model!r} is not served by this server."}
        common = {"name": e.name, "workload_size": e.workload_size, "scale_to_zero_enabled": e.scale_to_zero_enabled,
                  "state": state, "creation_timestamp": endpoint.updated_ms, "creator": "switchyard"}
        entities.append({**common, "entity_name": e.model, "entity_version": e.version})
        served_models.append({**common, "model_name": e.model, "model_version": e.version})
    config: dict[str, Any] = {"served_entities": entities, "served_models": served_models}
    if detailed:
        config["traffic_config"] = {"routes": [{"served_model_name": e.name, "served_entity_name": e.name, "traffic_percentage": e.traffic_percentage} for e in endpoint.served]}
        config["config_version"] = endpoint.config_version
    task = endpoints.task(endpoint)
    body = {
        "name": endpoint.name,
        "id": endpoint.id,
        "creator": "switchyard",
        "creation_timestamp": endpoint.created_ms,
        "last_updated_timestamp": endpoint.updated_ms,
        "state": {"ready": "READY" if endpoints.ready(endpoint) else "NOT_READY", "config_update": "NOT_UPDATING"},
        "config": config,
        "task": TASKS.get(task) if task else None,
        "tags": [{"key": k, "value": v} for k, v in endpoint.tags] or None,
        "description": endpoint.description,
    }
    if detailed:
        body["permission_level"] = "CAN_MANAGE"
    cleaned: dict[str, Any] = _clean(body)
    return cleaned


def register(
    app: Quart, models: ModelRegistry, endpoints: ServingEndpoints, handlers: Mapping[str, Handler], declared: list[tuple[CreateEndpointRequest, tuple[ServedEntity, ...]]]
) -> None:
    """Databricks' routes; `handlers`: the request formats invocations answer in (the OpenAI
    surface's), `declared`: the config file's endpoints, checked, applied when serving starts.
    Chat answers in Databricks' content blocks where the handlers have that format ("chat_blocks":
    a reasoning model's thinking as a `reasoning` block)."""
    handlers = {**handlers, "chat": handlers.get("chat_blocks", handlers["chat"])}

    async def invocations(name: str) -> Response:
        return await invoke(endpoints, models, handlers, name, await read_body())

    def openai_compatible(kind: str) -> Callable[[], Awaitable[Response]]:
        async def view() -> Response:
            body = await read_body()
            fields = decode_object(body)
            name = fields.get("model")
            if not isinstance(name, str) or not name:
                raise InvalidRequest("`model` names the serving endpoint on this path; it is required.", param="model")
            return await invoke(endpoints, models, handlers, name, body, kind, fields)

        return view

    async def create_endpoint() -> Response:
        endpoint = await endpoints.create(decode(await read_body(), CreateEndpointRequest))
        return json_response(endpoint_json(endpoints, endpoint))

    async def list_endpoints() -> Response:
        return json_response({"endpoints": [endpoint_json(endpoints, e, detailed=False) for e in endpoints.all()]})

    async def get_endpoint(name: str) -> Response:
        return json_response(endpoint_json(endpoints, endpoints.get(name)))

    async def update_config(name: str) -> Response:
        endpoint = await endpoints.update_config(name, decode(await read_body(), EndpointConfigInput))
        return json_response(endpoint_json(endpoints, endpoint))

    async def delete_endpoint(name: str) -> Response:
        await endpoints.delete(name)
        return json_response({})

    bind(app, "invocations", invocations, tuple(handlers[k].schema for k in ("chat", "completions", "embeddings") if k in handlers))
    for kind, route in OPENAI_COMPATIBLE.items():
        bind(app, route, openai_compatible(kind), _endpoint_named(handlers[kind].schema))
    bind(app, "create_endpoint", create_endpoint, CreateEndpointRequest)
    bind(app, "list_endpoints", list_endpoints)
    bind(app, "get_endpoint", get_endpoint)
    bind(app, "update_config", update_config, EndpointConfigInput)
    bind(app, "delete_endpoint", delete_endpoint)

    @app.before_serving
    async def _load_endpoints() -> None:
        await endpoints.load()
        await endpoints.apply_declared(declared)
