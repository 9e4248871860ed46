"""The context-length rules of every generation request: `fit_context`.

Owns: error_behavior "truncate" (keep the prompt's tail, leaving room for the output:
max_tokens, or a quarter of the context, at most 256, when it is unset), the
context_length_exceeded errors (naming the field the client sent), and max_tokens unset
meaning the rest of the context. Pure: the tokenizer actor applies it to every request, and
beam search (api/http/openai/completions/beam.py), whose requests never go through the actor
whole, to its prompts. Imports runtime.errors only.
"""

from __future__ import annotations

from runtime.errors import InvalidRequest


def output_room(max_tokens: int | None, max_model_len: int) -> int:
    """The tokens a truncated prompt leaves for the output: max_tokens, else some."""
    return min(max_tokens or min(256, max_model_len // 4), max_model_len - 1)


def fit_context(
    ids: list[int],
    max_tokens: int | None,
    max_model_len: int,
    *,
    truncate: bool = False,
    param: str = "prompt",
    max_tokens_param: str = "max_tokens",
) -> tuple[list[int], int, int]:
    """(prompt ids, max_tokens, tokens dropped from the prompt's head)."""
    if not ids:
        raise InvalidRequest("The prompt is empty.", param=param)
    truncated = 0
    if truncate:
        keep = max(1, max_model_len - output_room(max_tokens, max_model_len))
        if len(ids) > keep:
            truncated = len(ids) - keep
            ids = ids[-keep:]
    if len(ids) >= max_model_len:
        raise InvalidRequest(
            f"This model's maximum context length is {max_model_len} tokens; the prompt has {len(ids)}.",
            param=param,
            code="context_length_exceeded",
        )
    room = max_model_len - len(ids)
    if max_tokens is None:
        return ids, room, truncated
    if max_tokens > room:
        raise InvalidRequest(
            f"This model's maximum context length is {max_model_len} tokens; the prompt has "
            f"{len(ids)} and {max_tokens_param} asks for {max_tokens} more.",
            param=max_tokens_param,
            code="context_length_exceeded",
        )
    return ids, max_tokens, truncated
