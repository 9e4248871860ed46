"""A request's `Prompt` -> the token ids the model sees: the chat template rendered with the
request's template kwargs (tools included), a guide's fixed output start after the generation
prompt, then encoding.

The one place a prompt is rendered: the tokenizer actor (actors/tokenizer.py) encodes every
request with it, and the serve-ray ingress (api/cluster/ingress.py) with it hashes a prompt
into the KV block chain its replica's prefix cache will compute. Imports runtime; the
tokenizer object is transformers'.
"""

from __future__ import annotations

from typing import Any

from runtime.errors import InvalidRequest
from runtime.request import Prompt


def encode_prompt(tokenizer: Any, prompt: Prompt, prefix: str = "") -> list[int]:
    """`prefix`: the output's fixed start (`Guide.prefix`), written after the prompt (after
    the assistant's generation prompt) and encoded with it, so its tokens are the ones the
    text would have as a whole."""
    if prompt.token_ids is not None:
        return list(prompt.token_ids) + (tokenizer.encode(prefix, add_special_tokens=False) if prefix else [])
    if prompt.messages is not None:
        return encode_messages(tokenizer, prompt.messages, prompt.chat_template_kwargs, prefix)
    assert prompt.text is not None
    return tokenizer.encode(prompt.text + prefix, add_special_tokens=prompt.add_special_tokens)


def encode_messages(tokenizer: Any, messages: list[dict[str, Any]], kwargs: dict[str, Any], prefix: str = "") -> list[int]:
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
    except Exception as exc:  # jinja raises on messages the template rejects
        raise InvalidRequest(f"The chat template rejected these messages: {exc}", param="messages") from exc
    # The rendered template already holds BOS and role markers.
    return tokenizer.encode(text + prefix, add_special_tokens=False)
