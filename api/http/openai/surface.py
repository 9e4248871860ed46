"""The OpenAI surface in one call: `register(app, models)` binds its routes (/v1/...).

Also what other surfaces reuse, handed to them by create_app (surfaces never import each
other): `HANDLERS`, the request formats this surface answers (Azure ML's chat route and
Databricks' invocations decode the same structs and answer with the same `respond`), and
`ERRORS`, its error shape, the default for requests no other surface claims. "chat_blocks" is
the chat format answered in Databricks' content blocks for a reasoning model (chat/thinking.py).
Imports quart, api.http.shared, api.http.openai and runtime.
"""

from __future__ import annotations

from quart import Quart

from api.http.openai import embeddings, lora, models
from api.http.openai.chat import view as chat
from api.http.openai.chat.request import ChatCompletionRequest
from api.http.openai.common.errors import OpenAIErrors
from api.http.openai.completions import view as completions
from api.http.openai.completions.request import CompletionRequest
from api.http.openai.responses import view as responses
from api.http.shared.routes import Handler
from runtime.registry import ModelRegistry

ERRORS = OpenAIErrors()
HANDLERS = {
    "chat": Handler(ChatCompletionRequest, chat.respond),
    "chat_blocks": Handler(ChatCompletionRequest, chat.respond_blocks),
    "completions": Handler(CompletionRequest, completions.respond),
    "embeddings": Handler(embeddings.EmbeddingRequest, embeddings.respond),
}


def register(app: Quart, registry: ModelRegistry) -> None:
    for module in (chat, completions, embeddings, responses, models, lora):
        module.register(app, registry)
