"""Databricks model serving over HTTP: endpoint management and invocations (seeds 000-002).

Owns:
- `POST /serving-endpoints/{name}/invocations`: draws the endpoint's served entity by its
  traffic split, then dispatches by the endpoint's task and the body's shape (`messages`:
  chat, `prompt`: completions, `input`: embeddings) to that route module's
  `respond(models, req)`, with `model` set to the entity's served model. The response names
  the entity in the `served-model-name` header (what databricks-sdk reads into
  `QueryEndpointResponse.served_model_name`), and its `model` field is the served model;
- `/api/2.0/serving-endpoints` create, list, get, `PUT .../{name}/config` and delete, with
  Databricks' JSON (ServingEndpointDetailed; state READY / NOT_UPDATING, since changes apply
  at once);
- errors in Databricks' shape, `{"error_code": "...", "message": "..."}`.

The rules of endpoints live in api/serving_endpoints.py. Imports quart, msgspec, api and runtime.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from quart import Quart, Response, current_app, request

from api.http.edge import note_model
from api.http.errors import from_decode_error, json_response
from api.databricks.endpoints import TASKS, CreateEndpointRequest, Endpoint, EndpointConfigInput, ServingEndpoints
from runtime.errors import EngineDead, InvalidRequest, ModelNotFound, Overloaded, ServingError
from runtime.logging import get_logger
from runtime.registry import ModelRegistry

log = get_logger("databricks")

TABULAR_FIELDS = ("dataframe_records", "dataframe_split", "instances", "inputs")
_decoders: dict[type, msgspec.json.Decoder] = {}


def error_code(exc: ServingError) -> str:
    if exc.code and exc.code.isupper():
        return exc.code
    if isinstance(exc, InvalidRequest):
        return "MALFORMED_REQUEST" if exc.code == "invalid_json" else "INVALID_PARAMETER_VALUE"
    if isinstance(exc, ModelNotFound):
        return "RESOURCE_DOES_NOT_EXIST"
    if isinstance(exc, Overloaded):
        return "REQUEST_LIMIT_EXCEEDED"
    if isinstance(exc, EngineDead):
        return "TEMPORARILY_UNAVAILABLE"
    return "INTERNAL_ERROR"


def error_response(exc: ServingError) -> Response:
    message = str(exc)
    if exc.param and exc.param not in message:
        message = f"{message} (field: {exc.param})"
    headers = {}
    if isinstance(exc, Overloaded):
        headers["Retry-After"] = str(max(1, round(exc.retry_after)))
    return json_response({"error_code": error_code(exc), "message": message}, exc.status, headers)


def _databricks_errors(view: Callable[..., Awaitable[Response]]) -> Callable[..., Awaitable[Response]]:
    @functools.wraps(view)
    async def wrapped(*args: Any, **kwargs: Any) -> Response:
        try:
            return await view(*args, **kwargs)
        except ServingError as exc:
            return error_response(exc)

    return wrapped


def _decode(body: bytes, schema: type) -> Any:
    decoder = _decoders.get(schema)
    if decoder is None:
        decoder = _decoders[schema] = msgspec.json.Decoder(schema)
    try:
        return decoder.decode(body)
    except msgspec.DecodeError as exc:
        raise from_decode_error(exc) from None


async def _body() -> bytes:
    body = await request.get_data(cache=False)
    if current_app.config.get("LOG_PROMPTS"):  # --log-prompts only: bodies hold user data
        log.info("request_body", body=body[:8192].decode(errors="replace"))
    return body


# -- invocations ------------------------------------------------------------------------------


def _route_module(task: str, fields: dict[str, Any], endpoint: str) -> Any:
    """The route module (chat, completions or embeddings) that serves this body."""
    from api.openai import chat, completions

    kind = TASKS.get(task, task)
    if any(f in fields for f in TABULAR_FIELDS):
        raise InvalidRequest(f"Endpoint {endpoint!r} serves {kind}; tabular inputs ({', '.join(TABULAR_FIELDS)}) are for custom models.", param=next(f for f in TABULAR_FIELDS if f in fields))
    if task == "embed":
        if "input" not in fields:
            raise InvalidRequest(f"Endpoint {endpoint!r} serves {kind}: send `input`.", param="input")
        try:
            from api.openai import embeddings
        except ImportError:
            embeddings = None
        if embeddings is None or not hasattr(embeddings, "respond"):
            raise InvalidRequest("This server cannot run embeddings yet.", param="input")
        return embeddings
    if "messages" in fields:
        return chat
    if "prompt" in fields:
        return completions
    param = "input" if "input" in fields else "messages"
    raise InvalidRequest(f"Endpoint {endpoint!r} serves {kind}: send `messages` (chat) or `prompt` (completions).", param=param)


def _request_schema(module: Any) -> type:
    from api.openai import chat, completions
    from api.openai.schemas import ChatCompletionRequest, CompletionRequest

    if module is chat:
        return ChatCompletionRequest
    if module is completions:
        return CompletionRequest
    return module.EmbeddingRequest  # type: ignore[no-any-return]


async def invoke(endpoints: ServingEndpoints, models: ModelRegistry, name: str, body: bytes) -> Response:
    entity = endpoints.route(name)
    note_model(entity.model)
    task = _task_of(models, entity.model)
    try:
        fields = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise from_decode_error(exc) from None
    if not isinstance(fields, dict):
        raise InvalidRequest("The request body must be a JSON object.", code="invalid_json")
    module = _route_module(task, fields, name)
    req = msgspec.structs.replace(_decode(body, _request_schema(module)), model=entity.model)
    response: Response = await module.respond(models, req)
    response.headers["served-model-name"] = entity.name
    return response


def _task_of(models: ModelRegistry, name: str) -> str:
    for runtime in models:
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
    return _clean(body)  # type: ignore[no-any-return]


def register(app: Quart, models: ModelRegistry, endpoints: ServingEndpoints) -> None:
    @app.post("/serving-endpoints/<name>/invocations")
    @_databricks_errors
    async def invocations(name: str) -> Response:
        return await invoke(endpoints, models, name, await _body())

    @app.post("/api/2.0/serving-endpoints")
    @_databricks_errors
    async def create_endpoint() -> Response:
        endpoint = await endpoints.create(_decode(await _body(), CreateEndpointRequest))
        return json_response(endpoint_json(endpoints, endpoint))

    @app.get("/api/2.0/serving-endpoints")
    @_databricks_errors
    async def list_endpoints() -> Response:
        return json_response({"endpoints": [endpoint_json(endpoints, e, detailed=False) for e in endpoints.all()]})

    @app.get("/api/2.0/serving-endpoints/<name>")
    @_databricks_errors
    async def get_endpoint(name: str) -> Response:
        return json_response(endpoint_json(endpoints, endpoints.get(name)))

    @app.put("/api/2.0/serving-endpoints/<name>/config")
    @_databricks_errors
    async def update_config(name: str) -> Response:
        endpoint = await endpoints.update_config(name, _decode(await _body(), EndpointConfigInput))
        return json_response(endpoint_json(endpoints, endpoint))

    @app.delete("/api/2.0/serving-endpoints/<name>")
    @_databricks_errors
    async def delete_endpoint(name: str) -> Response:
        await endpoints.delete(name)
        return json_response({})
