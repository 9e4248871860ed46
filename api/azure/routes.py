"""Azure Machine Learning chat completions (seed 003): POST /chat/completions?api-version=...

Owns the Azure surface over the shared chat logic (`api.openai.chat.respond`):
- `api-version` is required and must be one Azure names (the seed's, and the
  azure-ai-inference SDK's default); anything else is a 400 naming it;
- the `extra-parameters` header decides what happens to body fields outside Azure's request
  table (`AZURE_FIELDS`):
    `error` (and no header): a 400 naming each extra field, with a `detail[]` entry per field;
    `ignore`: they are dropped before the request is read, as if never sent;
    `pass-through`: the whole body goes on to the engine, decoded by the same schema as
      POST /v1/chat/completions (`api.openai.schemas.ChatCompletionRequest`). So every field that
      schema knows takes effect exactly as it does there: top_k, repetition_penalty,
      ignore_eos, min_tokens, stop_token_ids, logprobs, n, max_completion_tokens, ... (and is
      validated there: a bad value is a 422 naming it). A field no schema knows cannot reach
      the model, so it is ignored, and the names (never the values) are logged
      (`extra_parameters_ignored`);
- `azureml-model-deployment` picks the served model (else the body's `model`, else the
  default chat model); a model that cannot chat (an embedder) is a 404 NotFoundError, as the
  seed's "route not supported by the model";
- text content parts are read, image parts are refused as 422 on a text-only model;
- every error is the seed's body, {"error", "message", "status"} (422 adds "code" and
  "detail": [{"loc", "value"}]), with the `x-ms-error-code` header. `is_azure` says which
  requests belong to this surface (Azure's paths, or anything sent with `api-version`), so
  that errors raised outside these views (401, 429, shed requests, unknown routes, wrong
  methods) take the same shape (api/errors.py `surface_error`, api/app.py).
GET /info (the SDK's get_model_info) describes the chosen model. Imports quart, msgspec, api
and runtime.
"""

from __future__ import annotations

import re
from http import HTTPStatus
from urllib.parse import parse_qsl
from typing import Any

import msgspec
from quart import Quart, Response, current_app, request

from api.http.edge import note_model
from api.http.errors import from_decode_error, json_response
from api.openai.schemas import ChatCompletionRequest
from runtime.engine import Runtime
from runtime.errors import EngineDead, InvalidRequest, ModelNotFound, Overloaded, ServingError
from runtime.logging import get_logger
from runtime.registry import ModelRegistry

log = get_logger("azure")

API_VERSIONS = ("2024-04-01-preview", "2024-05-01-preview")
# CreateChatCompletionRequest in seed 003, plus `model`, which Azure's SDKs send.
AZURE_FIELDS = frozenset(
    {"messages", "frequency_penalty", "max_tokens", "presence_penalty", "response_format", "seed", "stop",
     "stream", "temperature", "tool_choice", "tools", "top_p", "model"}
)
EXTRA_MODES = ("pass-through", "ignore", "error")
# The Azure AI model inference routes: errors on these paths are Azure's, whatever the query.
AZURE_PATHS = frozenset({"/chat/completions", "/info", "/embeddings", "/images/embeddings", "/completions"})
IMAGE_PARTS = ("image", "image_url", "input_image")
_CODES = {400: "BadRequest", 401: "Unauthorized", 404: "NotFound", 408: "RequestTimeout", 413: "PayloadTooLarge",
          422: "UnprocessableContent", 429: "TooManyRequests", 500: "InternalServerError", 503: "ServiceUnavailable"}
_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


class AzureError(ServingError):
    """An error with Azure's status and optional detail entries ({"loc": [...], "value": ...})."""

    def __init__(self, status: int, message: str, detail: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail


def azure_error(status: int, message: str, detail: list[dict[str, Any]] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """(body, headers) of an Azure error."""
    code = _CODES.get(status) or HTTPStatus(status).phrase.replace(" ", "")
    body: dict[str, Any] = {"error": HTTPStatus(status).phrase, "message": message, "status": status}
    if detail is not None or status == 422:
        body["code"] = code
        body["detail"] = detail or []
    return body, {"x-ms-error-code": code}


def is_azure(path: str, query: bytes | str | Any = b"") -> bool:
    """Whether a request belongs to the Azure surface: one of Azure's paths, or any path
    called with an `api-version` query parameter (how Azure clients address every route).
    `query`: the raw query string (ASGI's bytes, or str) or a mapping of query arguments."""
    if path in AZURE_PATHS:
        return True
    if isinstance(query, bytes):
        query = query.decode("latin-1")
    if isinstance(query, str):
        return "api-version" in query and any(k == "api-version" for k, _ in parse_qsl(query, keep_blank_values=True))
    return "api-version" in query


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


def _loc(param: str) -> list[str]:
    return [a or b for a, b in _STEP.findall(param)]


def _detail(fields: Any, *params: str) -> list[dict[str, Any]]:
    return [{"loc": ["body", *_loc(p)], "value": _value_at(fields, _loc(p))} for p in params]


def to_response(exc: ServingError, fields: Any = None) -> Response:
    detail = exc.detail if isinstance(exc, AzureError) else None
    headers: dict[str, str] = {}
    if isinstance(exc, AzureError):
        status = exc.status
    elif isinstance(exc, InvalidRequest):
        status = 400 if exc.code == "invalid_json" else 422  # the payload parses but cannot be served
        if status == 422 and exc.param:
            detail = _detail(fields, exc.param)
    elif isinstance(exc, ModelNotFound):
        status = 404
    elif isinstance(exc, Overloaded):
        status = 429
        headers["Retry-After"] = str(max(1, round(exc.retry_after)))
    elif isinstance(exc, EngineDead):
        status = 503
    else:
        status = exc.status if exc.status >= 400 else 500
    body, extra = azure_error(status, str(exc), detail)
    return json_response(body, status, {**headers, **extra})


def _check_api_version() -> None:
    version = request.args.get("api-version")
    supported = ", ".join(API_VERSIONS)
    if version is None:
        raise AzureError(400, f"The query parameter api-version is required; supported versions: {supported}.", [{"loc": ["query", "api-version"], "value": ""}])
    if version not in API_VERSIONS:
        raise AzureError(400, f"api-version {version!r} is not supported; supported versions: {supported}.", [{"loc": ["query", "api-version"], "value": version}])


def _pick(models: ModelRegistry, name: str | None) -> Runtime:
    deployment = request.headers.get("azureml-model-deployment") or name
    if deployment is None:
        return models.resolve(None)
    for runtime in models:
        if runtime.served_name == deployment:
            if runtime.task != "generate":
                raise AzureError(404, f"Model deployment {deployment!r} does not support the chat/completions route (it serves {runtime.task}).")
            return runtime
    raise AzureError(404, f"Model deployment {deployment!r} does not exist.")


def _apply_extra_parameters(fields: dict[str, Any]) -> dict[str, Any]:
    mode = request.headers.get("extra-parameters", "error")
    if mode not in EXTRA_MODES:
        raise AzureError(400, f"Header extra-parameters must be one of {', '.join(EXTRA_MODES)}, not {mode!r}.", [{"loc": ["header", "extra-parameters"], "value": mode}])
    extras = sorted(set(fields) - AZURE_FIELDS)
    if not extras:
        return fields
    if mode == "error":
        names = ", ".join(extras)
        raise AzureError(400, f"Extra parameters [{names}] are not allowed when extra-parameters is 'error' or not set; send extra-parameters: pass-through to pass them to the model, or ignore to drop them.", _detail(fields, *extras))
    if mode == "ignore":
        return {k: v for k, v in fields.items() if k in AZURE_FIELDS}
    unknown = [name for name in extras if name not in ChatCompletionRequest.__struct_fields__]
    if unknown:
        log.info("extra_parameters_ignored", names=[name[:64] for name in unknown[:32]], count=len(unknown))
    return fields


def _refuse_images(fields: dict[str, Any], runtime: Runtime) -> None:
    messages = fields.get("messages")
    if not isinstance(messages, list):
        return  # not a list at all: decoding names it (422), below
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else ()):
            if isinstance(part, dict) and part.get("type") in IMAGE_PARTS:
                param = f"messages[{i}].content[{j}]"
                raise AzureError(422, f"Model {runtime.served_name!r} reads text only; image content parts are not supported.", _detail(fields, param + ".type"))


async def _chat(models: ModelRegistry, fields: dict[str, Any]) -> Response:
    from api.openai import chat

    fields = _apply_extra_parameters(fields)
    model = fields.get("model")
    runtime = _pick(models, model if isinstance(model, str) else None)
    note_model(runtime.served_name)
    _refuse_images(fields, runtime)
    try:
        req = msgspec.convert({**fields, "model": runtime.served_name}, ChatCompletionRequest)
    except msgspec.ValidationError as exc:
        raise from_decode_error(exc) from None
    return await chat.respond(models, req)  # type: ignore[no-any-return]


def register(app: Quart, models: ModelRegistry) -> None:
    @app.post("/chat/completions")
    async def azure_chat_completions() -> Response:
        fields: Any = None
        try:
            _check_api_version()
            body = await request.get_data(cache=False)
            if current_app.config.get("LOG_PROMPTS"):  # --log-prompts only: bodies hold user data
                log.info("request_body", body=body[:8192].decode(errors="replace"))
            try:
                fields = msgspec.json.decode(body)
            except msgspec.DecodeError as exc:
                raise from_decode_error(exc) from None
            if not isinstance(fields, dict):
                raise AzureError(400, "The request body must be a JSON object.")
            return await _chat(models, fields)
        except ServingError as exc:
            return to_response(exc, fields)

    @app.get("/info")
    async def azure_model_info() -> Response:
        try:
            _check_api_version()
            runtime = _pick(models, None)
        except ServingError as exc:
            return to_response(exc)
        return json_response({"model_name": runtime.served_name, "model_type": "chat-completion", "model_provider_name": "Switchyard"})
