"""The OpenAI `usage` object, from the engine's counters."""

from __future__ import annotations

from typing import Any

from runtime.messages import Usage


def usage_dict(usage: Usage | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        **({"truncated_prompt_tokens": usage.truncated_prompt_tokens} if usage.truncated_prompt_tokens else {}),
    }
