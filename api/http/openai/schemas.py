"""Request bodies of the OpenAI-compatible routes, as msgspec structs.

Owns: field names, types, defaults and single-field ranges (`Meta`), per seeds 000-004.
Decoding a body with these structs is the first half of validation; `api/params.py` is the
second (cross-field rules, model limits). Unknown fields are accepted, since SDKs add fields
over time; known fields we cannot honour are rejected in params.py, naming the field.
Imports msgspec only.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, Meta(gt=0.0, le=1.0)]
# -1 (seed 004) or null means off; otherwise > 0. 0 is rejected in api/params.py, naming top_k
# (msgspec bounds one interval only).
TopK = Annotated[int, Meta(ge=-1)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
RepetitionPenalty = Annotated[float, Meta(gt=0.0, le=2.0)]
PositiveInt = Annotated[int, Meta(ge=1)]
# Seeds are uint64 in seed 004 and int64 in OpenAI's API; msgspec decodes both ranges but can
# not bound past int64, so api/params.py checks the range.
Seed = int
TokenId = Annotated[int, Meta(ge=0)]


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class ContentPart(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None
    image_url: Any = None
    input_audio: Any = None
    file: Any = None


class ChatMessage(msgspec.Struct, kw_only=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class SamplingFields(msgspec.Struct, kw_only=True):
    """Fields Chat and Completions share, with the seeds' defaults."""

    model: str | None = None
    max_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = None
    n: Annotated[int, Meta(ge=1, le=128)] = 1
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: Seed | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # vLLM / MindIE extensions that clients of those servers send.
    ignore_eos: bool = False
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    min_tokens: Annotated[int, Meta(ge=0)] = 0


class ChatCompletionRequest(SamplingFields, kw_only=True):
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    # Seeds 000/001: "low", "medium" (the default) or "high"; seed 003 has no such field.
    reasoning_effort: Literal["low", "medium", "high"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None


class CompletionRequest(SamplingFields, kw_only=True):
    # A string, a list of strings, a list of token ids, or a list of token-id lists. msgspec
    # allows one array type per union, so list items are a union checked in params.py.
    prompt: str | list[str | TokenId | list[TokenId]]
    echo: bool = False
    suffix: str | None = None
    logprobs: Annotated[int, Meta(ge=0, le=5)] | None = None
    best_of: Annotated[int, Meta(ge=1, le=128)] | None = None
    use_beam_search: bool = False
    use_raw_prompt: bool = False
    error_behavior: Literal["truncate", "error"] = "error"
