"""Reading calls that follow a marker, for every format but Hermes: `MarkedParser`.

Owns: splitting streamed output into text and the calls after an opening marker (a special
token such as `<|python_tag|>` or `[TOOL_CALLS]`, anywhere in the output) or a lead (a `{` or
`[` the whole answer starts with, kept as the calls' first character), holding back only what
may still turn out to be a marker. The calls are read whole where their closing marker comes
(or at the end of the output) by the format's `read`, which returns (name, arguments) pairs or
None when the text is not calls after all: then it stays text. A call names a tool the model
may call now or it is text; under a forcing tool_choice there is no text at all. Events are
ToolCallParser's (api/http/openai/tools/parser.py), a call's arguments in one fragment.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from api.http.openai.tools.formats.base import arguments_text
from api.http.openai.tools.parser import Event, StepParser, ToolCall
from api.http.openai.tools.spec import ToolSet

Read = Callable[[str], list[tuple[str, Any]] | None]


class MarkedParser(StepParser):
    def __init__(
        self, toolset: ToolSet | None, prefix: str, new_id: Callable[[], str], read: Read, opens: tuple[str, ...] = (), leads: tuple[str, ...] = (),
        closes: str | None = None,
    ) -> None:  # fmt: skip
        self.toolset = toolset = toolset or ToolSet(())
        self.calls: list[ToolCall] = []
        self._names = {t.name for t in toolset.callable()}
        self._no_text = toolset.forcing
        self._new_id, self._read, self._opens, self._leads, self._closes = new_id, read, opens, leads, closes
        self._buf = prefix  # always a suffix of the prefix and everything fed
        self._fed = 0
        self._in_calls = False
        self._marker = ""  # the opening that started the calls (given back with them if they are text)
        self._started = bool(prefix.strip())  # past the output's start: leads no longer count

    def finish(self) -> list[Event]:
        events = self.feed("")
        if self._in_calls:
            events += self._calls(self._buf, complete=self._closes is None)
        elif self._buf:
            self._text(events, self._buf, self._base)
        self._buf, self._in_calls = "", False
        return events

    @property
    def _base(self) -> int:
        """Where the buffer starts in everything fed."""
        return self._fed - len(self._buf)

    def _step(self, events: list[Event]) -> bool:
        if self._in_calls:
            if self._closes is None or self._closes not in self._buf:
                return False
            at = self._buf.index(self._closes)
            events += self._calls(self._buf[:at], complete=True)
            self._buf, self._in_calls = self._buf[at + len(self._closes) :], False
            return True
        if not self._started:
            body = self._buf.lstrip()
            if not body:
                return False
            lead = next((mark for mark in self._leads if body.startswith(mark)), None)
            if lead is None and any(mark.startswith(body) for mark in self._leads):
                return False  # may still become a lead
            self._started = True
            if lead is not None:
                self._buf, self._in_calls, self._marker = body, True, ""
                return True
        at, mark = min(((self._buf.find(m), m) for m in self._opens if m in self._buf), default=(-1, ""))
        if at < 0:
            keep = max((_partial_suffix(self._buf, m) for m in self._opens), default=0)
            ready = self._buf[: len(self._buf) - keep]
            if ready:
                self._text(events, ready, self._base)
                self._buf = self._buf[len(ready) :]
            return False
        if at:
            self._text(events, self._buf[:at], self._base)
        self._buf, self._in_calls, self._marker = self._buf[at + len(mark) :], True, mark
        return True

    def _text(self, events: list[Event], text: str, start: int) -> None:
        if text and not self._no_text:
            events.append(("text", text, start))

    def _calls(self, payload: str, complete: bool) -> list[Event]:
        events: list[Event] = []
        parsed = self._read(payload)
        tools = [self.toolset.get(name) for name, _ in parsed or ()]
        if not parsed or any(tool is None or tool.name not in self._names for tool in tools):
            self._text(events, self._marker + payload + (self._closes or "") * complete, self._base - len(self._marker))
            return events
        for tool, (_, arguments) in zip(tools, parsed):
            assert tool is not None
            call = ToolCall(tool.kind, tool.name, call_id=self._new_id())
            self.calls.append(call)
            events.append(("start", call))
            call = replace(call, text=arguments_text(tool, arguments))
            events.append(("delta", call, call.text))
            self.calls[-1] = call = replace(call, complete=complete)
            events.append(("done", call))
        return events


def _partial_suffix(text: str, marker: str) -> int:
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
