"""The OpenAI `usage` object of Chat and Completions, as msgspec structs, from the engine's
counters. (Responses counts in its own shape: responses/response.py `ResponseUsage`.)

Imports msgspec and runtime.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
from msgspec import UNSET, UnsetType

from runtime.messages import Usage


class PromptTokensDetails(msgspec.Struct):
    cached_tokens: int


class CompletionTokensDetails(msgspec.Struct):
    reasoning_tokens: int = 0


class ChatUsage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    truncated_prompt_tokens: int | UnsetType = UNSET  # only when error_behavior cut the prompt
    # Of completion_tokens, those a reasoning model thought (0 for a model that does not think).
    completion_tokens_details: CompletionTokensDetails = msgspec.field(default_factory=CompletionTokensDetails)
    reasoning_tokens: int | UnsetType = UNSET  # the seeds' flat field: Databricks' answers from a reasoning model


class CompletionUsage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    truncated_prompt_tokens: int
    # MindIE completions, per generated token: the batch size of the step that produced it and
    # the microseconds its request waited in the queue.
    batch_size: list[int]
    queue_wait_time: list[int]


def chat_usage(usages: Sequence[Usage], flat_reasoning: bool = False) -> ChatUsage | None:
    """One request's sequences (n of them share the prompt): the prompt counted once.
    `flat_reasoning`: say reasoning_tokens at the top level too (Databricks)."""
    if not usages:
        return None
    first = usages[0]
    completion = sum(u.completion_tokens for u in usages)
    reasoning = sum(u.reasoning_tokens for u in usages)
    return ChatUsage(
        prompt_tokens=first.prompt_tokens,
        completion_tokens=completion,
        total_tokens=first.prompt_tokens + completion,
        prompt_tokens_details=PromptTokensDetails(first.cached_tokens),
        truncated_prompt_tokens=first.truncated_prompt_tokens or UNSET,
        completion_tokens_details=CompletionTokensDetails(reasoning),
        reasoning_tokens=reasoning if flat_reasoning else UNSET,
    )


def completion_usage(usages: Sequence[Usage], per_prompt: int) -> CompletionUsage | None:
    """Every sequence of a batch of prompts, `per_prompt` sequences each: the prompt, its cached
    and its truncated tokens count once per prompt, not once per sequence that shares it."""
    if not usages:
        return None
    firsts = usages[::per_prompt]
    prompt_tokens = sum(u.prompt_tokens for u in firsts)
    completion_tokens = sum(u.completion_tokens for u in usages)
    return CompletionUsage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(sum(u.cached_tokens for u in firsts)),
        truncated_prompt_tokens=sum(u.truncated_prompt_tokens for u in firsts),
        batch_size=[b for u in usages for b in u.batch_size],
        queue_wait_time=[w for u in usages for w in u.queue_wait_time],
    )
