"""gpt-oss's harmony format (`openai`): an answer is messages on channels, with special tokens kept.

    <|channel|>analysis<|message|>THINKING<|end|>
    <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{...}<|call|>
    <|start|>assistant<|channel|>final<|message|>ANSWER<|return|>

(the generation prompt ends with `<|start|>assistant`; a recipient may also follow the channel,
`<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>`). The analysis channel is
the reasoning, a commentary message to `functions.NAME` a call (one a message), final and other
commentary the answer. Owns: `HarmonyParser` (the events of the other parsers, plus
("reasoning", text)), the grammar of a call, and the history (the template renders it: one
call per assistant message, its thinking beside it).
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

from api.http.openai.tools.formats.base import ToolFormat, arguments_text, inline_schema, tool_parameters
from api.http.openai.tools.formats.render import render_for_template
from api.http.openai.tools.parser import Event, StepParser, ToolCall
from api.http.openai.tools.spec import ToolSet
from runtime.sampling import Guide

START, CHANNEL, MESSAGE, END, CALL, RETURN, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|constrain|>"
_ENDS = (END, CALL, RETURN)
_RECIPIENT = re.compile(r"to=functions\.([\w.\-]+)")


class Harmony(ToolFormat):
    name = "openai"
    markers = (START, CHANNEL, MESSAGE, END, CALL, RETURN, CONSTRAIN)  # the channels: special tokens the parser must see
    thinks = True  # the analysis channel is reasoning, with or without tools

    def render(self, messages: list[dict[str, Any]], toolset: ToolSet | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        return render_for_template(self, messages, toolset, lambda calls: "")

    def parser(self, toolset: ToolSet | None, prefix: str = "") -> HarmonyParser:
        return HarmonyParser(toolset, prefix, self.new_call_id)

    def guide(self, toolset: ToolSet, text_guide: Guide | None) -> Guide | None:
        """Forced calls only (under auto the model writes its own channels, read back by the
        parser): the analysis channel, free, then one call to a callable tool."""
        if not toolset.forcing:
            return None
        m = self.marker
        tools = toolset.callable()
        rules = [f"swy_call: {' | '.join(f'swy_call_{i}' for i in range(len(tools)))}", r"SWY_THOUGHT: /[^<]*/"]
        for i, tool in enumerate(tools):
            head = json.dumps(f" to=functions.{tool.name}")
            rules.append(f'swy_call_{i}: {head} {m(CHANNEL)} "commentary json" {m(MESSAGE)} %json {inline_schema(tool_parameters(tool))} {m(CALL)}')
        analysis = f'{m(CHANNEL)} "analysis" {m(MESSAGE)} SWY_THOUGHT {m(END)} {m(START)} "assistant"'
        return Guide(kind="lark", definition="\n".join([f"start: ({analysis})? swy_call", *rules]) + "\n", param="tools")


class HarmonyParser(StepParser):
    def __init__(self, toolset: ToolSet | None, prefix: str, new_id: Any) -> None:
        self.toolset = toolset
        self.calls: list[ToolCall] = []
        self._names = {t.name for t in toolset.callable()} if toolset is not None else set()
        self._no_text = toolset is not None and toolset.forcing
        self._new_id = new_id
        self._buf = prefix
        self._fed = 0
        self._header: str | None = ""  # the message header being read; None while in its content
        self._channel, self._recipient = "", ""

    def finish(self) -> list[Event]:
        events = self.feed("")
        if self._header is None:
            self._content(events, self._buf, final=True)
        self._buf = ""
        return events

    def _step(self, events: list[Event]) -> bool:
        if self._header is not None:  # a header: up to <|message|>
            at = self._buf.find(MESSAGE)
            if at < 0:
                return False
            header = self._header + self._buf[:at]
            self._buf, self._header = self._buf[at + len(MESSAGE) :], None
            self._channel = header.split(CHANNEL)[-1].split()[0] if CHANNEL in header else ""
            found = _RECIPIENT.search(header)
            self._recipient = found.group(1) if found else ""
            return True
        ends = [(self._buf.find(e), e) for e in _ENDS if e in self._buf]
        if not ends:
            keep = max(_partial(self._buf, e) for e in _ENDS)
            ready = self._buf[: len(self._buf) - keep]
            if ready and not self._recipient:
                self._content(events, ready)
                self._buf = self._buf[len(ready) :]
            return False
        at, end = min(ends)
        self._content(events, self._buf[:at], final=True)
        rest = self._buf[at + len(end) :]
        self._buf, self._header = (rest[len(START) :] if rest.startswith(START) else rest), ""
        return True

    def _content(self, events: list[Event], text: str, final: bool = False) -> None:
        if self._recipient:
            if final:
                self._call(events, self._recipient, text)
            return
        if not text:
            return
        if self._channel == "analysis":
            events.append(("reasoning", text))
        elif not self._no_text:
            events.append(("text", text, self._fed - len(self._buf)))

    def _call(self, events: list[Event], name: str, text: str) -> None:
        tool = self.toolset.get(name) if self.toolset is not None else None
        if tool is None or name not in self._names:
            if not self._no_text:
                events.append(("text", text, self._fed - len(self._buf)))
            return
        call = ToolCall(tool.kind, name, call_id=self._new_id())
        self.calls.append(call)
        events.append(("start", call))
        call = replace(call, text=arguments_text(tool, text))
        events.append(("delta", call, call.text))
        self.calls[-1] = call = replace(call, complete=True)
        events.append(("done", call))


def _partial(text: str, marker: str) -> int:
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
