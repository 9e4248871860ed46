"""What POST /v1/responses answers, as msgspec structs: the `Response` object (`ResponseObject`)
and its output items, as the openai SDK's `openai.types.responses` types them; the stream's
events are responses/events.py's.

The Response repeats the request's settings: `ResponseObject`'s defaults are what it repeats
for a request that set none (responses/params.py `echoed` fills in the rest). Its state
(`status`, `output`, `error`, `incomplete_details`, `usage`, `completed_at`) is kept by the
events builder; `completed_at` is absent until the Response ends. Imports msgspec and
api.http.openai.common.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from api.http.openai.common.logprobs import TokenLogprob
from runtime.messages import Usage

Status = Literal["in_progress", "completed", "incomplete", "failed"]


# -- output items -----------------------------------------------------------------------------


class OutputText(msgspec.Struct, kw_only=True, tag_field="type", tag="output_text"):
    text: str = ""
    annotations: list[Any] = []
    logprobs: list[TokenLogprob] = []  # the SDK's ResponseOutputText.Logprob (with bytes)


class MessageItem(msgspec.Struct, kw_only=True, tag_field="type", tag="message"):
    id: str
    role: Literal["assistant"] = "assistant"
    status: Status = "in_progress"
    content: list[OutputText] = []


class FunctionCallItem(msgspec.Struct, kw_only=True, tag_field="type", tag="function_call"):
    id: str
    status: Status = "in_progress"
    arguments: str = ""
    call_id: str
    name: str


class CustomToolCallItem(msgspec.Struct, kw_only=True, tag_field="type", tag="custom_tool_call"):
    id: str
    status: Status = "in_progress"
    input: str = ""
    call_id: str
    name: str


class ReasoningText(msgspec.Struct, kw_only=True, tag_field="type", tag="reasoning_text"):
    text: str = ""


class ReasoningItem(msgspec.Struct, kw_only=True, tag_field="type", tag="reasoning"):
    """A reasoning model's thinking, before the message or calls it led to: the raw thinking
    as one `reasoning_text` part (no summary is made)."""

    id: str
    summary: list[Any] = []
    content: list[ReasoningText] = []
    status: Status = "in_progress"


OutputItem = MessageItem | FunctionCallItem | CustomToolCallItem | ReasoningItem


# -- the Response -----------------------------------------------------------------------------


class ResponseError(msgspec.Struct, kw_only=True):
    """The Databricks Foundation Model API's Error: type, code and message required, param
    null unless one request field caused it."""

    type: str
    code: str
    message: str
    param: str | None = None


class IncompleteDetails(msgspec.Struct):
    reason: str


class InputTokensDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int
    cache_write_tokens: int = 0  # the SDK's type requires it; the prefix cache does not count writes


class OutputTokensDetails(msgspec.Struct, kw_only=True):
    reasoning_tokens: int = 0  # of output_tokens, those a reasoning model thought


class ResponseUsage(msgspec.Struct, kw_only=True):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails = msgspec.field(default_factory=OutputTokensDetails)
    total_tokens: int


class TextSettings(msgspec.Struct, kw_only=True):
    format: dict[str, Any] = msgspec.field(default_factory=lambda: {"type": "text"})
    verbosity: str | UnsetType = UNSET


class ReasoningSettings(msgspec.Struct, kw_only=True):
    effort: str | None = None
    generate_summary: str | None = None
    summary: str | None = None
    encrypted_content: str | UnsetType = UNSET  # opaque: echoed back untouched


class ResponseObject(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    model: str
    # The request's settings, repeated.
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    tools: list[dict[str, Any]] = []  # as declared (tools/spec.py `Tool.openai`)
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    text: TextSettings = msgspec.field(default_factory=TextSettings)
    reasoning: ReasoningSettings | None = None
    metadata: dict[str, str] = {}
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    user: str | None = None
    truncation: Literal["auto", "disabled"] = "disabled"
    top_logprobs: int = 0
    store: bool = False
    background: bool = False
    service_tier: str = "default"
    previous_response_id: None = None
    prompt: None = None
    # Its state, kept by the events builder.
    status: Status = "in_progress"
    output: list[OutputItem] = []
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    usage: ResponseUsage | None = None
    completed_at: int | None | UnsetType = UNSET


def response_usage(usage: Usage | None) -> ResponseUsage | None:
    """The Responses `usage` object, from the engine's counters."""
    if usage is None:
        return None
    return ResponseUsage(
        input_tokens=usage.prompt_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=usage.cached_tokens),
        output_tokens=usage.completion_tokens,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=usage.reasoning_tokens),
        total_tokens=usage.prompt_tokens + usage.completion_tokens,
    )
