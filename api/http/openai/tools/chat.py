"""Tool calls in Chat's shapes: `tool_calls` on a whole message, and streamed `delta`s.

Imports api.http.openai.tools.
"""

from __future__ import annotations

from typing import Any

from api.http.openai.tools.parser import Event, ToolCall, ToolCallParser
from api.http.openai.tools.spec import ToolSet


def chat_tool_call(call: ToolCall) -> dict[str, Any]:
    if call.kind == "custom":
        return {"id": call.call_id, "type": "custom", "custom": {"name": call.name, "input": call.text}}
    return {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.text}}


def chat_message_parts(text: str, toolset: ToolSet, prefix: str = "") -> tuple[str | None, list[dict[str, Any]]]:
    """A whole output → (content, tool_calls); content is None when only calls were made, or
    could be (a forcing tool_choice allows no text). `prefix`: the output's start that the
    prompt held (`Guide.prefix`)."""
    parser = ToolCallParser(toolset, prefix)
    events = parser.feed(text) + parser.finish()
    content = "".join(e[1] for e in events if e[0] == "text")
    calls = [chat_tool_call(c) for c in parser.calls]
    return (content or None) if calls or toolset.forcing else content, calls


class ChatDeltas:
    """Streamed output → Chat `delta` objects: `content`, or `tool_calls` entries by index.

    As OpenAI streams them: a call's first entry has its id, type, name and empty arguments
    (input), each later one its index and the next fragment only, so a client that
    concatenates the fragments gets the arguments once. Every delta is a new dict built from
    the event's frozen call."""

    def __init__(self, toolset: ToolSet, prefix: str = "") -> None:
        self.parser = ToolCallParser(toolset, prefix)
        self._index: dict[str, int] = {}

    @property
    def called(self) -> bool:
        return bool(self.parser.calls)

    def feed(self, text: str) -> list[dict[str, Any]]:
        return self._deltas(self.parser.feed(text)) if text else []

    def finish(self) -> list[dict[str, Any]]:
        return self._deltas(self.parser.finish())

    def _deltas(self, events: list[Event]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for kind, *rest in events:
            if kind == "text":
                out.append({"content": rest[0]})
            elif kind == "start":
                call: ToolCall = rest[0]
                self._index[call.call_id] = len(self._index)
                entry = chat_tool_call(call)
                out.append({"tool_calls": [{"index": self._index[call.call_id], **entry}]})
            elif kind == "delta":
                call, text = rest
                body = {"custom": {"input": text}} if call.kind == "custom" else {"function": {"arguments": text}}
                out.append({"tool_calls": [{"index": self._index[call.call_id], **body}]})
        return out
