"""Tool calls (and thinking) in Chat's shapes: `tool_calls` on a whole message, and streamed
`Delta`s, from the events of the output parser (api/http/openai/tools/output.py).

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


class ChatDeltas:
    """The output parser's events (tools/output.py) → Chat `Delta`s: `content`, `reasoning`
    (Databricks' content blocks with `blocks`), or `tool_calls` entries by index.

    As OpenAI streams them: a call's first entry has its id, type, name and empty arguments
    (input), each later one its index and the next fragment only, so a client that
    concatenates the fragments gets the arguments once. Every delta is built anew from the
    event's frozen call."""

    def __init__(self, blocks: bool = False) -> None:
        self.blocks = blocks
        self._index: dict[str, int] = {}

    def deltas(self, events: list[Event]) -> list[Delta]:
        out: list[Delta] = []
        for kind, *rest in events:
            if kind == "text":
                out.append(Delta(content=rest[0]))
            elif kind == "reasoning":
                out.append(Delta(content=[reasoning_block(rest[0])]) if self.blocks else Delta(reasoning=rest[0], reasoning_content=rest[0]))
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


def reasoning_block(text: str) -> dict[str, Any]:
    """Databricks' content block of a reasoning model's thinking."""
    return {"type": "reasoning", "summary": [{"type": "summary_text", "text": text}]}
