"""What admission charges a request before it is tokenized (`max_pending_tokens`).

Owns: `estimate_tokens`, used by `Runtime.open` against the runtime's token budget. Pure: no
trio, no tokenizer. The request-count rule (`max_pending`) is `Runtime.full`.
"""

from __future__ import annotations

from typing import Any

from runtime.request import Prompt
from runtime.sampling import SamplingParams


def estimate_tokens(prompt: Prompt, sampling: SamplingParams, max_model_len: int) -> int:
    """What admission charges a request, before it is tokenized: prompt + tokens to generate.

    Text counts 1 token per 4 UTF-8 bytes (plus 4 per chat message for role markers); token
    ids count exactly. Without max_tokens the request may run to the context length. Capped at
    `max_model_len`: one request never holds more than a full context.
    """
    if prompt.token_ids is not None:
        num_prompt = len(prompt.token_ids)
    elif prompt.messages is not None:
        num_prompt = sum(4 + _text_bytes(m.get("content")) // 4 for m in prompt.messages)
    else:
        num_prompt = _text_bytes(prompt.text) // 4 + 1
    num_new = sampling.max_tokens if sampling.max_tokens is not None else max_model_len - num_prompt
    return max(1, min(max_model_len, num_prompt + max(0, num_new)))


def _text_bytes(content: Any) -> int:
    if isinstance(content, str):
        return len(content.encode())
    if isinstance(content, list):  # content parts
        return sum(_text_bytes(part.get("text") if isinstance(part, dict) else part) for part in content)
    return 0
