"""Logprobs in the two shapes clients expect: Chat's `content[]` and the legacy Completions
object (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`, seeds 000/004).

Owns: token text for a token id (decoded alone, cached per tokenizer) and both layouts.
"""

from __future__ import annotations

import weakref
from typing import Any

from runtime.messages import Logprob

# tokenizer → token id → text. Weakly keyed on the tokenizer itself: keyed on id(), a cache
# outlived its tokenizer and served another model's token texts once Python reused the id.
_texts: weakref.WeakKeyDictionary[Any, dict[int, str]] = weakref.WeakKeyDictionary()


def token_text(tokenizer: Any, token_id: int) -> str:
    cache = _texts.get(tokenizer)
    if cache is None:
        cache = _texts[tokenizer] = {}
    text = cache.get(token_id)
    if text is None:
        text = cache[token_id] = tokenizer.decode([token_id])
        if len(cache) > 200_000:
            cache.clear()
    return text


def chat_logprobs(tokenizer: Any, entries: list[Logprob]) -> dict[str, Any]:
    def item(token_id: int, logprob: float) -> dict[str, Any]:
        text = token_text(tokenizer, token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {
        "content": [
            {**item(e.token_id, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]} for e in entries
        ],
        "refusal": None,
    }


def legacy_logprobs(
    tokenizer: Any, entries: list[Logprob | None], token_ids: list[int], text_start: int = 0
) -> dict[str, Any]:
    """`entries[i]` scores `token_ids[i]` (None for a first prompt token, which has no context)."""
    tokens, token_logprobs, tops, offsets = [], [], [], []
    offset = text_start
    for token_id, entry in zip(token_ids, entries):
        text = token_text(tokenizer, token_id)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if entry is None:
            token_logprobs.append(None)
            tops.append(None)
        else:
            token_logprobs.append(entry.logprob)
            tops.append({token_text(tokenizer, t): lp for t, lp in entry.top})
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}
