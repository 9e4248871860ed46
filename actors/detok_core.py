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
        self.num_taken = 0  # of the last push's tokens, those the output keeps (see push)
        self.text = ""  # everything emitted so far

    def push(self, token_ids: list[int]) -> tuple[str, str | None]:
        """Feed tokens; return (text safe to emit now, the stop string hit or None).

        Stop strings are looked for after each token, as when tokens come one a step: several
        at once (a kept speculative draft and the token after it) must stop where one at a
        time would. On a hit, `num_taken` says how many of `token_ids` the output keeps: those
        up to the one that completed the stop string (the rest are dropped, and not counted)."""
        self.num_taken = len(token_ids)
        for i, token_id in enumerate(token_ids):
            self._ids.append(token_id)
            piece = self._stream.step(self._tokenizer, token_id)
            if not piece:
                continue
            self._pending += piece
            hit = self._find_stop() if self._stop else None
            if hit is not None:
                index, stop = hit
                out = self._pending[: index + (len(stop) if self._include_stop else 0)]
                self._pending = ""
                self.text += out
                self.num_taken = i + 1
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
