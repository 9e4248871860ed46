"""Azure Machine Learning chat completions: POST /chat/completions?api-version=...

Owns the Azure surface's routes, over the chat format `register` is handed (the OpenAI
surface's chat handler, from create_app: surfaces never import each other):
- `api-version` is required and must be one Azure names (its reference's, and the
  azure-ai-inference SDK's default); anything else is a 400 naming it;
- the `extra-parameters` header decides what happens to body fields outside Azure's request
  table (`AZURE_FIELDS`): `error` (and no header) a 400 naming each, `ignore` dropped,
  `pass-through` on to the engine as POST /v1/chat/completions reads them (comment on
  `_apply_extra_parameters`);
- `azureml-model-deployment` picks the served model (else the body's `model`, else the
  default chat model); a model that cannot chat (an embedder) is a 404 NotFoundError, as
  Azure's reference has it: "route not supported by the model";
- text content parts are read; image parts (with `detail`) go to a vision-language model and are
  refused as 422 on a text-only model;
- every error is Azure's body (api/http/azure/errors.py), also for errors raised outside
  these views (401, 429, shed requests, unknown routes, wrong methods).
GET /info (the SDK's get_model_info) describes the chosen model. Imports quart, api.http.shared,
api.http.azure and runtime.
"""

from __future__ import annotations

from typing import Any

from quart import Quart, Response, request

from api.http.azure.errors import AzureRequestError, detail, with_detail
from api.http.shared.body import convert, decode_object, read_body
from api.http.shared.edge import note_model
from api.http.shared.errors import json_response
from api.http.shared.routes import AZURE_API_VERSIONS, Handler, bind
from runtime.errors import ServingError
from runtime.logging import get_logger
from runtime.protocol import Runtime
from runtime.registry import ModelRegistry

log = get_logger("azure")

# CreateChatCompletionRequest in Azure ML's chat completions, plus `model`, which Azure's SDKs
# send.
AZURE_FIELDS = frozenset(
    {"messages", "frequency_penalty", "max_tokens", "presence_penalty", "response_format", "seed", "stop",
     "stream", "temperature", "tool_choice", "tools", "top_p", "model"}
)
EXTRA_MODES = ("pass-through", "ignore", "error")
IMAGE_PARTS = ("image", "image_url", "input_image")
EXTRA_PARAMETERS_DOC = {
    "name": "extra-parameters", "in": "header", "required": False,
    "description": "What happens to body fields outside Azure's request table: pass-through (to the engine), ignore (dropped), error (400; the default).",
    "schema": {"type": "string", "enum": list(EXTRA_MODES), "default": "error"},
}


def _check_api_version() -> None:
    version = request.args.get("api-version")
    supported = ", ".join(AZURE_API_VERSIONS)
    if version is None:
        raise AzureRequestError(400, f"The query parameter api-version is required; supported versions: {supported}.", [{"loc": ["query", "api-version"], "value": ""}])
    if version not in AZURE_API_VERSIONS:
        raise AzureRequestError(400, f"api-version {version!r} is not supported; supported versions: {supported}.", [{"loc": ["query", "api-version"], "value": version}])


def _pick(models: ModelRegistry, name: str | None) -> Runtime:
    deployment = request.headers.get("azureml-model-deployment") or name
    if deployment is None:
        return models.resolve(None)
    for runtime in models.served():
        if runtime.served_name == deployment:
            if runtime.task != "generate":
                raise AzureRequestError(404, f"Model deployment {deployment!r} does not support the chat/completions route (it serves {runtime.task}).")
            return runtime
    raise AzureRequestError(404, f"Model deployment {deployment!r} does not exist.")


# `error` (and no header): a 400 naming each extra field, with a `detail[]` entry per field;
# `ignore`: they are dropped before the request is read, as if never sent; `pass-through`: the
# whole body goes on to the engine, decoded by the same schema as POST /v1/chat/completions (the
# handler's struct). So every field that schema knows takes effect exactly as it does there:
# top_k, repetition_penalty, ignore_eos, min_tokens, stop_token_ids, logprobs, n,
# max_completion_tokens, ... (and is validated there: a bad value is a 422 naming it). A field no
# schema knows cannot reach the model, so it is ignored, and the names (never the values) are
# logged (`extra_parameters_ignored`).
def _apply_extra_parameters(fields: dict[str, Any], known: frozenset[str]) -> dict[str, Any]:
    mode = request.headers.get("extra-parameters", "error")
    if mode not in EXTRA_MODES:
        raise AzureRequestError(400, f"Header extra-parameters must be one of {', '.join(EXTRA_MODES)}, not {mode!r}.", [{"loc": ["header", "extra-parameters"], "value": mode}])
    extras = sorted(set(fields) - AZURE_FIELDS)
    if not extras:
        return fields
    if mode == "error":
        names = ", ".join(extras)
        raise AzureRequestError(400, f"Extra parameters [{names}] are not allowed when extra-parameters is 'error' or not set; send extra-parameters: pass-through to pass them to the model, or ignore to drop them.", detail(fields, *extras))
    if mode == "ignore":
        return {k: v for k, v in fields.items() if k in AZURE_FIELDS}
    unknown = [name for name in extras if name not in known]
    if unknown:
        log.info("extra_parameters_ignored", names=[name[:64] for name in unknown[:32]], count=len(unknown))
    return fields


def _refuse_images(fields: dict[str, Any], runtime: Runtime) -> None:
    messages = fields.get("messages")
    if not isinstance(messages, list) or runtime.max_images_per_prompt > 0:
        return  # not a list at all: decoding names it (422), below; a vision-language model reads them
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        for j, part in enumerate(content if isinstance(content, list) else ()):
            if isinstance(part, dict) and part.get("type") in IMAGE_PARTS:
                param = f"messages[{i}].content[{j}]"
                raise AzureRequestError(422, f"Model {runtime.served_name!r} reads text only; image content parts are not supported.", detail(fields, param + ".type"))


async def _chat(models: ModelRegistry, chat: Handler, fields: dict[str, Any]) -> Response:
    fields = _apply_extra_parameters(fields, frozenset(getattr(chat.schema, "__struct_fields__", ())))
    model = fields.get("model")
    runtime = _pick(models, model if isinstance(model, str) else None)
    note_model(runtime.served_name)
    _refuse_images(fields, runtime)
    return await chat.respond(models, convert({**fields, "model": runtime.served_name}, chat.schema))


def register(app: Quart, models: ModelRegistry, chat: Handler) -> None:
    """Azure's routes; `chat`: the chat format they answer in (the OpenAI surface's)."""

    async def azure_chat_completions() -> Response:
        fields: Any = None
        try:
            _check_api_version()
            fields = decode_object(await read_body())
            return await _chat(models, chat, fields)
        except ServingError as exc:
            raise with_detail(exc, fields) from None

    async def azure_model_info() -> Response:
        _check_api_version()
        runtime = _pick(models, None)
        return json_response({"model_name": runtime.served_name, "model_type": "chat-completion", "model_provider_name": "Switchyard"})

    bind(app, "azure_chat_completions", azure_chat_completions, chat.schema, [EXTRA_PARAMETERS_DOC])
    bind(app, "azure_model_info", azure_model_info)
