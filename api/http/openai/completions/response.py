"""What POST /v1/completions answers, as msgspec structs: the `text_completion` object, whole or
as the chunks of a stream (the same object, one choice each; a last one with only usage when
`stream_options.include_usage` asks for it).

Imports msgspec and api.http.openai.common.
"""

from __future__ import annotations

from typing import Literal

import msgspec
from msgspec import UNSET, UnsetType

from api.http.openai.common.logprobs import LegacyLogprobs
from api.http.openai.common.usage import CompletionUsage


class CompletionChoice(msgspec.Struct, kw_only=True):
    index: int
    text: str
    logprobs: LegacyLogprobs | None
    finish_reason: str | None
    stop_reason: str | int | None


class Completion(msgspec.Struct, kw_only=True):
    """A whole completion, or one chunk of a stream (`usage` absent from a chunk unless
    stream_options.include_usage asks for it: null until the last)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    system_fingerprint: str
    usage: CompletionUsage | None | UnsetType = UNSET
    choices: list[CompletionChoice]
