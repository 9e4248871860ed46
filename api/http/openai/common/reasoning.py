"""A reasoning model's output, split into its thinking and its answer, as it streams; and what a
request asks of thinking (`reasoning_effort`).

Owns: `ReasoningParser` (the first stage of the output parser pipeline: the tool-call parser
after it sees only the answer), `split_reasoning` (a whole output, the same parser fed once,
so a stream and a whole answer agree by construction) and `thinking_params` (effort → the
template switch and the engine's thinking budget). Imports its neighbours and runtime.

The rules:
- a prompt that opened `<think>` starts the output inside thinking; otherwise a `<think>` at
  the very start of the output (after whitespace) opens it, and anything else is all answer;
- thinking ends at the first `</think>` (or a tag that implies it, such as `<tool_call>`,
  which stays in the answer); everything after it is answer, a second `<think>` or a literal
  `</think>` included;
- no closing tag before the end: all of it was thinking;
- whitespace around the thinking and at the start of the answer is dropped (the template's
  `\\n` after the tags); a family that wraps the answer after thinking (Granite's
  `<response>...</response>`) has the wrapper's tags dropped;
- only a suffix that could still become a tag (or trailing whitespace) is held back, and each
  character is looked at a bounded number of times: linear in the output.
"""

from __future__ import annotations

from typing import Any

from runtime.errors import InvalidRequest
from runtime.reasoning import EFFORTS, ThinkingFormat
from runtime.sampling import Guide, Thinking

_MAYBE, _THINK, _ANSWER = 0, 1, 2


class ReasoningParser:
    """Streamed output → (reasoning, answer) pieces, per `feed`; `finish` flushes the rest."""

    def __init__(self, fmt: ThinkingFormat, thinking: Thinking | None) -> None:
        self.start, self.end, self.implicit = fmt.start, fmt.end, fmt.implicit_ends
        self._state = _ANSWER if thinking is None else _THINK if thinking.open else _MAYBE
        self._buf = ""  # held back: could still become a tag, or whitespace that may be dropped
        self._lead = self._state != _ANSWER  # at the start of the thinking or of the answer after it: strip whitespace
        self._tags = (self.end, *self.implicit)
        self.thought = False  # any thinking was read
        self.fed = 0  # characters fed so far
        # Where the answer starts in everything fed (once it has started): an answer piece is
        # always the end of what was fed so far, and the answer runs on unbroken from there.
        self.answer_base: int | None = None
        self._raw_base: int | None = None
        self._unwrap = _Unwrap(*fmt.answer_wrap) if fmt.answer_wrap and thinking is not None else None

    def feed(self, text: str) -> tuple[str, str]:
        if not text:
            return "", ""
        self.fed += len(text)
        if self._state == _ANSWER and not self._buf and self._unwrap is None:
            return "", self._located(self._answer(text))
        self._buf += text
        if self._state == _MAYBE:
            thought, answer = self._maybe()
        elif self._state == _THINK:
            thought, answer = self._think()
        else:
            buf, self._buf = self._buf, ""
            thought, answer = "", self._answer(buf)
        return thought, self._located(answer)

    def finish(self) -> tuple[str, str]:
        buf, self._buf = self._buf, ""
        if self._state == _THINK:
            return (buf if not self._lead else buf.lstrip()).rstrip(), ""
        answer = buf if self._state == _MAYBE else self._answer(buf)
        return "", self._located(answer, final=True)

    def _located(self, answer: str, final: bool = False) -> str:
        if answer and self._raw_base is None:
            self._raw_base = self.fed - len(answer)  # an answer piece is the end of what was fed
        if self._unwrap is not None:
            answer = self._unwrap.feed(answer) + (self._unwrap.finish() if final else "")
        if answer and self.answer_base is None:
            self.answer_base = (self._raw_base or 0) + (self._unwrap.dropped if self._unwrap is not None else 0)
        return answer

    def _maybe(self) -> tuple[str, str]:
        head = self._buf.lstrip()
        if head.startswith(self.start):
            self._buf, self._state, self.thought = head[len(self.start) :], _THINK, True
            return self._think()
        if self.start.startswith(head):
            return "", ""  # still possibly the tag
        self._state, self._lead = _ANSWER, False
        buf, self._buf = self._buf, ""
        return "", buf

    def _think(self) -> tuple[str, str]:
        buf = self._buf
        if self._lead:
            buf = buf.lstrip()
            if not buf:
                self._buf = ""
                return "", ""
            self._lead = False
        self.thought = True
        at, tag = _first(buf, self._tags)
        if at < 0:
            keep = max(_partial_suffix(buf, t) for t in self._tags)
            body = buf[: len(buf) - keep]
            out = body.rstrip()  # trailing whitespace waits: it may come before the end tag
            self._buf = buf[len(out) :]
            return out, ""
        reasoning = buf[:at].rstrip()
        rest = buf[at + len(tag) :] if tag == self.end else buf[at:]
        self._buf, self._state, self._lead = "", _ANSWER, tag == self.end
        return reasoning, self._answer(rest)

    def _answer(self, text: str) -> str:
        if self._lead:
            text = text.lstrip()
            if not text:
                return ""
            self._lead = False
        return text


class _Unwrap:
    """The answer without its wrapper's tags: an opening one at its very start, each closing one
    in the text; only a suffix that could still be either is held back. `dropped`: how many
    characters of the answer came before its first kept one."""

    def __init__(self, opening: str, closing: str) -> None:
        self.opening, self.closing = opening, closing
        self.buf = ""
        self.at_start = True
        self.dropped = 0
        self._kept = False

    def feed(self, text: str) -> str:
        self.buf += text
        if self.at_start:
            if self.opening.startswith(self.buf):
                return ""
            self.at_start = False
            if self.buf.startswith(self.opening):
                rest = self.buf[len(self.opening) :].lstrip()
                self.dropped, self.buf = len(self.buf) - len(rest), rest
        keep = _partial_suffix(self.buf, self.closing)
        done, self.buf = self.buf[: len(self.buf) - keep], self.buf[len(self.buf) - keep :]
        out = done.replace(self.closing, "")
        if not self._kept:
            at = 0
            while done.startswith(self.closing, at):
                at += len(self.closing)
            self.dropped += at if out else len(done)
            self._kept = bool(out)
        return out

    def finish(self) -> str:
        buf, self.buf = self.buf, ""
        return "" if buf == self.opening else buf


def split_reasoning(fmt: ThinkingFormat, thinking: Thinking | None, text: str) -> tuple[str, str]:
    """A whole output → (reasoning, answer), exactly as the stream splits it."""
    parser = ReasoningParser(fmt, thinking)
    r1, a1 = parser.feed(text)
    r2, a2 = parser.finish()
    return r1 + r2, a1 + a2


def keeps_special_tokens(tool_format: Any, fmt: ThinkingFormat | None, control: Thinking | None) -> bool:
    """Whether the output's text must keep special tokens: the tool format's parser reads them,
    or thinking is on and its tags are special tokens (Magistral's `[THINK]`)."""
    return bool(getattr(tool_format, "keeps_special_tokens", False)) or (control is not None and fmt is not None and fmt.special)


def _first(text: str, tags: tuple[str, ...]) -> tuple[int, str]:
    best, found = -1, ""
    for tag in tags:
        at = text.find(tag)
        if at >= 0 and (best < 0 or at < best):
            best, found = at, tag
    return best, found


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest suffix of text that is a proper prefix of marker."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


# -- what a request asks of thinking ------------------------------------------------------------


def thinking_params(
    fmt: ThinkingFormat | None, kwargs: dict[str, Any], effort: str | None, explicit: dict[str, Any] | None, guide: Guide | None, field: str
) -> tuple[dict[str, Any], Thinking | None]:
    """The template kwargs and the engine's `Thinking` for a request to a model of format
    `fmt` (None: a model that does not think; the effort is accepted and ignored).

    `none`/`minimal` turn thinking off through the template's switch (a model without one keeps
    thinking, within the low budget); low/medium/high set the thinking budget. An explicit
    `chat_template_kwargs` switch wins over the effort. A forced tool call (a guide with a
    prefix, written after the generation prompt) turns thinking off where the switch exists, so
    the call's opening follows the prompt as the grammar expects."""
    if effort is not None and effort not in EFFORTS:
        raise InvalidRequest(f"{field} must be one of {', '.join(EFFORTS)}, not {effort!r}.", param=field, code="invalid_value")
    if fmt is None:
        return kwargs, None
    explicit = explicit or {}
    switch = fmt.switch
    if switch is not None and switch not in explicit:
        if effort in ("none", "minimal") or (guide is not None and guide.prefix):
            kwargs = {**kwargs, switch: False}
        elif effort is not None and not fmt.default_on:  # asked to reason: a model thinking only when asked
            kwargs = {**kwargs, switch: True}
    on = fmt.thinking_on(kwargs)
    budget = None
    if effort in ("low", "medium", "high", "xhigh", "max"):
        budget = fmt.budgets.get(effort, fmt.budgets["high"])
    elif effort in ("none", "minimal") and on:
        budget = fmt.budgets["low"]
    return kwargs, fmt.control(on, budget, guided=guide is not None)
