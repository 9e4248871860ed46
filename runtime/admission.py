"""Admission rules, each written once: when a runtime is full (`max_pending`), and what a
request is charged against `max_pending_tokens` before it is tokenized.

`is_full` is applied by `Runtime.open` to every request and by the API edge's load shedding
(api/http/admission.py) before a body is read; `estimate_tokens` by `Runtime.open`. Pure: no
trio, no tokenizer.
"""

from __future__ import annotations

from typing import Any

from runtime.request import Prompt
from runtime.sampling import SamplingParams


def is_full(live: int, max_pending: int, n: int = 1) -> bool:
    """Whether a runtime with `live` admitted, unfinished requests cannot take `n` more."""
    return live + n > max_pending


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
