"""The one parser every surface reads a generation's text through, streamed or whole.

Owns `OutputParser`: a reasoning model's thinking first (common/reasoning.py `ReasoningParser`),
then the answer through the model's tool format's parser (tools/formats/) when tools may be
called, else as text, so a `<tool_call>` written while thinking is never a call. `feed(text)` and
`finish()` give events in one vocabulary:

    ("reasoning", text) | ("text", text, start) | ("start", call) | ("delta", call, fragment) | ("done", call)

`start` being where the text begins in everything fed (Responses matches it to the tokens'
logprobs); `whole(text)` is a whole output fed once, so a stream and a whole answer agree by
construction. Chat turns the events into `Delta`s and a message (chat/thinking.py), which the
Databricks and Azure surfaces answer with; Responses into its typed stream events
(responses/view.py). Imports api.http.openai.common (the reasoning parser) and runtime.
"""

from __future__ import annotations

from typing import Any

from api.http.openai.common.reasoning import ReasoningParser
from api.http.openai.tools.parser import Event
from runtime.reasoning import ThinkingFormat
from runtime.sampling import Thinking


class OutputParser:
    def __init__(self, fmt: ThinkingFormat | None, thinking: Thinking | None, tools: Any) -> None:
        """`fmt`: the model's thinking format (None: it does not think); `tools`: a fresh parser
        of its tool format (`params.output_parser()`; None: the answer is all text)."""
        self.reasoning = ReasoningParser(fmt, thinking) if fmt is not None else None
        self.tools = tools
        self._fed = 0  # characters fed so far

    @property
    def calls(self) -> list[Any]:
        """The calls read so far (the tool parser's `ToolCall`s)."""
        return list(self.tools.calls) if self.tools is not None else []

    @property
    def forcing(self) -> bool:
        """A forcing `tool_choice`: the answer may hold no text."""
        return self.tools is not None and self.tools.toolset is not None and self.tools.toolset.forcing

    def feed(self, text: str) -> list[Event]:
        start = self._fed
        self._fed += len(text)
        if self.reasoning is None:
            return self._answer(text, start)
        thought, answer = self.reasoning.feed(text)
        return self._thought(thought) + self._answer(answer, self.reasoning.fed - len(answer))

    def finish(self) -> list[Event]:
        events: list[Event] = []
        if self.reasoning is not None:
            thought, answer = self.reasoning.finish()
            events = self._thought(thought) + self._answer(answer, self.reasoning.fed - len(answer))
        return events + (self._located(self.tools.finish()) if self.tools is not None else [])

    def whole(self, text: str) -> tuple[str, list[Any], str]:
        """A whole output → (text, calls, reasoning): everything the events say, joined."""
        events = self.feed(text) + self.finish()
        return "".join(e[1] for e in events if e[0] == "text"), self.calls, "".join(e[1] for e in events if e[0] == "reasoning")

    def _thought(self, text: str) -> list[Event]:
        return [("reasoning", text)] if text else []

    def _answer(self, text: str, start: int) -> list[Event]:
        if not text:
            return []
        if self.tools is None:
            return [("text", text, start)]
        return self._located(self.tools.feed(text))

    def _located(self, events: list[Event]) -> list[Event]:
        """The tool parser's text events, `start` moved from the answer's start to the output's."""
        base = (self.reasoning.answer_base or 0) if self.reasoning is not None else 0
        return [("text", e[1], e[2] + base) if e[0] == "text" else e for e in events]
