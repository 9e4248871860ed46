"""Incremental detokenization with stop strings. Pure: no trio.

Owns: `IncrementalDetokenizer`, one per request. Tokens go in, text comes out such that
  - no half UTF-8 character is ever emitted (tokenizers' `DecodeStream` holds partial bytes);
  - no stop string ever leaks into the stream: the last `len(longest stop) - 1` characters are
    held back until it is certain they do not start a stop string.
"""

from __future__ import annotations

from typing import Any

from tokenizers.decoders import DecodeStream


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: Any,  # a `tokenizers.Tokenizer` (the fast backend)
        *,
        skip_special_tokens: bool = True,
        stop: tuple[str, ...] = (),
        include_stop_str_in_output: bool = False,
    ) -> None:
        self._tokenizer = tokenizer
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self._stop = tuple(s for s in stop if s)
        self._include_stop = include_stop_str_in_output
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._pending = ""  # decoded, not yet emitted
        self._skip_special = skip_special_tokens
        self._ids: list[int] = []  # every token pushed
        self.text = ""  # everything emitted so far

    def push(self, token_ids: list[int]) -> tuple[str, str | None]:
        """Feed tokens; return (text safe to emit now, the stop string hit or None)."""
        self._ids.extend(token_ids)
        for token_id in token_ids:
            piece = self._stream.step(self._tokenizer, token_id)
            if piece:
                self._pending += piece
        if self._stop:
            hit = self._find_stop()
            if hit is not None:
                index, stop = hit
                out = self._pending[: index + (len(stop) if self._include_stop else 0)]
                self._pending = ""
                self.text += out
                return out, stop
        cut = len(self._pending) - self._hold
        if cut <= 0:
            return "", None
        out, self._pending = self._pending[:cut], self._pending[cut:]
        self.text += out
        return out, None

    def flush(self) -> str:
        """The request finished for another reason: the held-back tail is safe now.

        Bytes of an incomplete UTF-8 character that DecodeStream still holds are emitted the
        way a full decode renders them (U+FFFD), so the streamed text always equals
        `tokenizer.decode(all tokens)`.
        """
        out, self._pending = self._pending, ""
        full = self._tokenizer.decode(self._ids, skip_special_tokens=self._skip_special)
        if full.startswith(self.text + out):
            out = full[len(self.text) :]
        self.text += out
        return out

    def _find_stop(self) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for stop in self._stop:
            index = self._pending.find(stop)
            if index != -1 and (best is None or index < best[0]):
                best = (index, stop)
        return best
