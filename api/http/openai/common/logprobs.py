"""Logprobs in the two shapes clients expect, as msgspec structs: Chat's `content[]`
(`ChatLogprobs`, whose entries Responses' output_text parts carry too) and the legacy
Completions object (`LegacyLogprobs`: `tokens`, `token_logprobs`, `top_logprobs`,
`text_offset`, as the Databricks Foundation Model API and MindIE completions have them).

Owns: token text for a token id (decoded alone, cached per tokenizer) and both layouts.
Imports msgspec and runtime.
"""

from __future__ import annotations

import weakref
from typing import Any

import msgspec

from runtime.messages import Logprob


class TopLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChatLogprobs(msgspec.Struct):
    content: list[TokenLogprob]
    refusal: None = None


class LegacyLogprobs(msgspec.Struct):
    tokens: list[str]
    token_logprobs: list[float | None]  # None: a first prompt token, which has no context
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]

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


_byte_decoder: dict[str, int] | None = None


def token_bytes(tokenizer: Any, token_id: int) -> list[int]:
    """The token's own bytes: a byte-level BPE piece or a `<0xNN>` byte-fallback token may be
    part of a UTF-8 character, which its decoded text (U+FFFD) cannot show."""
    global _byte_decoder
    piece = tokenizer.convert_ids_to_tokens(token_id)
    if isinstance(piece, str):
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return [int(piece[3:5], 16)]
        if _byte_decoder is None:
            _byte_decoder = {c: b for b, c in _bytes_to_unicode().items()}
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        if "ByteLevel" in type(decoder).__name__ and all(c in _byte_decoder for c in piece):
            return [_byte_decoder[c] for c in piece]
    return list(token_text(tokenizer, token_id).encode())


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte → printable character map used by byte-level BPE vocabularies."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


def token_logprobs(tokenizer: Any, entries: list[Logprob]) -> list[TokenLogprob]:
    """Each token with its text, bytes and alternatives (Chat's and Responses' entries)."""

    def top(token_id: int, logprob: float) -> TopLogprob:
        return TopLogprob(token_text(tokenizer, token_id), logprob, token_bytes(tokenizer, token_id))

    return [
        TokenLogprob(token_text(tokenizer, e.token_id), e.logprob, token_bytes(tokenizer, e.token_id), [top(t, lp) for t, lp in e.top])
        for e in entries
    ]


def chat_logprobs(tokenizer: Any, entries: list[Logprob]) -> ChatLogprobs:
    return ChatLogprobs(token_logprobs(tokenizer, entries))


def legacy_logprobs(
    tokenizer: Any, entries: list[Logprob | None], token_ids: list[int], text_start: int = 0
) -> LegacyLogprobs:
    """`entries[i]` scores `token_ids[i]` (None for a first prompt token, which has no context)."""
    tokens: list[str] = []
    chosen: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    offset = text_start
    for token_id, entry in zip(token_ids, entries):
        text = token_text(tokenizer, token_id)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if entry is None:
            chosen.append(None)
            tops.append(None)
        else:
            chosen.append(entry.logprob)
            # Best first; two tokens with the same text keep the likelier one's value. The
            # chosen token is always listed (MindIE completions, as vLLM: up to logprobs + 1
            # entries).
            top: dict[str, float] = {}
            for t, lp in entry.top:
                top.setdefault(token_text(tokenizer, t), lp)
            top.setdefault(text, entry.logprob)
            tops.append(top)
    return LegacyLogprobs(tokens, chosen, tops, offsets)
