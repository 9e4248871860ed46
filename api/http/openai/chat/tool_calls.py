"""Tool calls in Chat's shapes: `tool_calls` on a whole message, and streamed `Delta`s, from the
events of the model's format's parser (api/http/openai/tools/formats/).

Imports api.http.openai.tools and api.http.openai.chat.
"""

from __future__ import annotations

from typing import Any

from api.http.openai.chat.response import CustomCall, Delta, FunctionCall, ToolCall, ToolCallDelta
from api.http.openai.tools.parser import Event
from api.http.openai.tools.parser import ToolCall as ParsedCall


def chat_tool_call(call: ParsedCall) -> ToolCall:
    if call.kind == "custom":
        return ToolCall(id=call.call_id, type="custom", custom=CustomCall(name=call.name, input=call.text))
    return ToolCall(id=call.call_id, type="function", function=FunctionCall(name=call.name, arguments=call.text))


def chat_message_parts(text: str, parser: Any) -> tuple[str | None, list[ToolCall], str]:
    """A whole output, through its format's parser → (content, tool_calls, reasoning); content
    is None when only calls were made, or could be (a forcing tool_choice allows no text)."""
    events = parser.feed(text) + parser.finish()
    content = "".join(e[1] for e in events if e[0] == "text")
    reasoning = "".join(e[1] for e in events if e[0] == "reasoning")
    calls = [chat_tool_call(c) for c in parser.calls]
    forcing = parser.toolset is not None and parser.toolset.forcing
    return (content or None) if calls or forcing else content, calls, reasoning


class ChatDeltas:
    """Streamed output → Chat `Delta`s: `content`, or `tool_calls` entries by index.

    As OpenAI streams them: a call's first entry has its id, type, name and empty arguments
    (input), each later one its index and the next fragment only, so a client that
    concatenates the fragments gets the arguments once. Every delta is built anew from the
    event's frozen call."""

    def __init__(self, parser: Any) -> None:
        self.parser = parser  # the model's format's (api/http/openai/tools/formats/)
        self._index: dict[str, int] = {}

    @property
    def called(self) -> bool:
        return bool(self.parser.calls)

    def feed(self, text: str) -> list[Delta]:
        return self._deltas(self.parser.feed(text)) if text else []

    def finish(self) -> list[Delta]:
        return self._deltas(self.parser.finish())

    def _deltas(self, events: list[Event]) -> list[Delta]:
        out: list[Delta] = []
        for kind, *rest in events:
            if kind == "text":
                out.append(Delta(content=rest[0]))
            elif kind == "reasoning":  # a format that splits out thinking itself (harmony)
                out.append(Delta(reasoning=rest[0], reasoning_content=rest[0]))
            elif kind == "start":
                call: ParsedCall = rest[0]
                self._index[call.call_id] = len(self._index)
                whole = chat_tool_call(call)
                entry = ToolCallDelta(index=self._index[call.call_id], id=whole.id, type=whole.type, function=whole.function, custom=whole.custom)
                out.append(Delta(tool_calls=[entry]))
            elif kind == "delta":
                call, text = rest
                index = self._index[call.call_id]
                if call.kind == "custom":
                    entry = ToolCallDelta(index=index, custom=CustomCall(input=text))
                else:
                    entry = ToolCallDelta(index=index, function=FunctionCall(arguments=text))
                out.append(Delta(tool_calls=[entry]))
        return out
