"""GET /v1/models and /v1/models/{id}: the `list` of `model` cards, as msgspec structs.

Imports msgspec, quart, api.http.shared and runtime.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType
from quart import Quart, Response

from api.http.shared.errors import json_response
from api.http.shared.routes import bind
from runtime.errors import ModelNotFound
from runtime.protocol import Runtime
from runtime.registry import ModelRegistry


class ModelCard(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "switchyard"
    max_model_len: int
    model_impl: str | None  # native[+int4...] | transformers; null when the runner does not say
    # A reasoning model's thinking: its parser (runtime/reasoning.py PARSERS), whether reasoning_effort
    # none/minimal can turn it off, and the low/medium/high budgets. Absent for other models.
    reasoning: dict[str, Any] | UnsetType = UNSET
    # The format its tool calls are written in (runtime/tool_formats.py); absent for an embedder.
    tool_call_parser: str | UnsetType = UNSET
    # The model's sampling defaults in force (runtime/generation_defaults.py); absent when none.
    sampling_defaults: dict[str, Any] | UnsetType = UNSET
    # Tokens the paged KV cache holds (the context window is at most this); absent for an embedder.
    kv_cache_tokens: int | UnsetType = UNSET
    # A LoRA adapter's base model (vLLM's `parent`); absent for a base model.
    parent: str | UnsetType = UNSET


class ModelList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def model_card(runtime: Runtime) -> ModelCard:
    impl = (runtime.info.impl or None) if runtime.info else None
    thinking = getattr(runtime, "thinking", None)
    reasoning = thinking.card() if thinking is not None else UNSET
    tool_format = getattr(runtime, "tool_format", "") or UNSET
    defaults = runtime.sampling_defaults.card() if getattr(runtime, "sampling_defaults", None) is not None else {}
    info = runtime.info
    tokens = info.num_kv_blocks * info.block_size if info is not None and info.num_kv_blocks else UNSET
    return ModelCard(
        id=runtime.served_name, created=runtime.created, max_model_len=runtime.max_model_len, model_impl=impl, reasoning=reasoning, tool_call_parser=tool_format,
        sampling_defaults=defaults or UNSET, kv_cache_tokens=tokens, parent=getattr(runtime, "parent", None) or UNSET,
    )


def register(app: Quart, models: ModelRegistry) -> None:
    async def list_models() -> Response:
        return json_response(ModelList(data=[model_card(r) for r in models.served()]))

    async def get_model(model_id: str) -> Response:
        for runtime in models.served():
            if runtime.served_name == model_id:
                return json_response(model_card(runtime))
        raise ModelNotFound(model_id)

    bind(app, "list_models", list_models)
    bind(app, "get_model", get_model)
