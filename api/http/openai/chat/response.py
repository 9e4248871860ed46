"""What POST /v1/chat/completions answers, as msgspec structs: the `chat.completion` object and
the `chat.completion.chunk`s of a stream, as OpenAI's SDK types them (Azure ML's and
Databricks' chat routes answer the same).

A field that is absent (rather than null) on the wire is `UNSET`: a chunk's `usage` without
`stream_options.include_usage`, `truncated_prompt_tokens` unless the prompt was cut, and the
parts of a tool-call delta that only its first fragment carries. Imports msgspec and
api.http.openai.common.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from api.http.openai.common.logprobs import ChatLogprobs
from api.http.openai.common.usage import ChatUsage


class FunctionCall(msgspec.Struct, kw_only=True):
    name: str | UnsetType = UNSET  # a streamed call's later fragments carry no name
    arguments: str


class CustomCall(msgspec.Struct, kw_only=True):
    name: str | UnsetType = UNSET
    input: str


class ToolCall(msgspec.Struct, kw_only=True):
    """One call on a whole message: a function's (`function`) or a custom tool's (`custom`)."""

    id: str
    type: Literal["function", "custom"]
    function: FunctionCall | UnsetType = UNSET
    custom: CustomCall | UnsetType = UNSET


class AssistantMessage(msgspec.Struct, kw_only=True):
    """A reasoning model's message also has its thinking as `reasoning` and, under the older
    name many clients still read, `reasoning_content` (null when it did not think); another
    model's has neither."""

    role: Literal["assistant"] = "assistant"
    content: str | list[dict[str, Any]] | None  # a list: Databricks' content blocks (chat/thinking.py)
    reasoning: str | None | UnsetType = UNSET
    reasoning_content: str | None | UnsetType = UNSET
    refusal: None = None
    tool_calls: list[ToolCall] | None = None


class Choice(msgspec.Struct, kw_only=True):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: str | None
    stop_reason: str | int | None


class ChatCompletion(msgspec.Struct, kw_only=True):
    id: str
    created: int
    model: str
    system_fingerprint: str
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[Choice]
    usage: ChatUsage | None


# -- a stream ---------------------------------------------------------------------------------


class ToolCallDelta(msgspec.Struct, kw_only=True):
    """A call's first fragment carries its id, type and name (and empty arguments or input);
    each later one its index and the next fragment only."""

    index: int
    id: str | UnsetType = UNSET
    type: Literal["function", "custom"] | UnsetType = UNSET
    function: FunctionCall | UnsetType = UNSET
    custom: CustomCall | UnsetType = UNSET


class Delta(msgspec.Struct, kw_only=True):
    """Empty (`{}`) on the chunk that carries a finish_reason."""

    role: Literal["assistant"] | UnsetType = UNSET
    content: str | list[dict[str, Any]] | UnsetType = UNSET
    reasoning: str | UnsetType = UNSET  # a reasoning model's thinking, as it streams (both names)
    reasoning_content: str | UnsetType = UNSET
    tool_calls: list[ToolCallDelta] | UnsetType = UNSET


class ChunkChoice(msgspec.Struct, kw_only=True):
    index: int
    delta: Delta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(msgspec.Struct, kw_only=True):
    id: str
    created: int
    model: str
    system_fingerprint: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    # null on every chunk but the last when stream_options.include_usage asks for it; absent
    # otherwise.
    usage: ChatUsage | None | UnsetType = UNSET
    choices: list[ChunkChoice]
