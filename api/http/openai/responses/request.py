"""The POST /v1/responses request body (the Databricks Foundation Model API's Responses API),
as msgspec structs.

Owns: field names, types, defaults and single-field ranges. `input` items, `tools` and
`tool_choice` come in several shapes, so they decode as plain JSON here and are checked item
by item in responses/input.py and tools/validate.py, which name the exact path of a bad item.
Fields the reference says we must refuse (background, store, conversation, service_tier)
decode as anything, so that the refusal is a 400 naming them rather than a type error.
Imports msgspec and api.http.openai.common.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from api.http.openai.common.fields import PositiveInt, Temperature, TopP


class ResponsesStreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False
    include_obfuscation: bool = False  # the SDK may send it; we never obfuscate


class TextConfig(msgspec.Struct, kw_only=True):
    format: dict[str, Any] | None = None  # {"type": "text" | "json_object" | "json_schema", ...}
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningConfig(msgspec.Struct, kw_only=True, omit_defaults=True):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None
    encrypted_content: str | None = None  # opaque: echoed back untouched


class ResponsesRequest(msgspec.Struct, kw_only=True):
    input: str | list[dict[str, Any]]
    model: str | None = None
    instructions: str | None = None
    max_output_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stream: bool = False
    stream_options: ResponsesStreamOptions | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    tool_choice: str | dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: PositiveInt | None = None
    metadata: dict[str, str] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    safety_identifier: str | None = None
    user: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    include: list[str] | None = None
    prompt: dict[str, Any] | None = None
    # Refused with a 400 when given (the Databricks reference), or needing state this server
    # does not keep.
    background: Any = None
    store: Any = None
    conversation: Any = None
    service_tier: Any = None
    previous_response_id: Any = None
