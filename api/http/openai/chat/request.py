"""The POST /v1/chat/completions request body, as msgspec structs (the Databricks Foundation
Model API's and Azure ML's chat completions, which OpenAI's SDK sends too).

Owns: the fields only Chat has; the ones it shares with Completions are
common/fields.py `SamplingFields`. Cross-field rules are chat/params.py's. Imports msgspec and
api.http.openai.common.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from api.http.openai.common.fields import PositiveInt, SamplingFields


class ContentPart(msgspec.Struct, kw_only=True):
    type: str
    text: str | None = None
    image_url: Any = None  # {"url": ..., "detail": ...} or a URL (an image part)
    detail: str | None = None  # an input_image part's detail
    input_audio: Any = None
    file: Any = None


class ChatMessage(msgspec.Struct, kw_only=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    # An earlier assistant turn's thinking (`reasoning`, or the older `reasoning_content`):
    # handed to the chat template as `reasoning_content`, which renders or drops it.
    reasoning: str | None = None
    reasoning_content: str | None = None


class ChatCompletionRequest(SamplingFields, kw_only=True):
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    # The Databricks reference: "low", "medium" (the default) or "high"; OpenAI's also "none" and
    # "minimal" (thinking off where the template can turn it off). Checked in params.py (a 400
    # naming it); ignored by a model that does not think. Azure ML's chat has no such field.
    reasoning_effort: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
