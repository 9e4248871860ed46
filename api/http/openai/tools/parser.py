"""Reading tool calls back out of generated text, incrementally, so they can be streamed.

Owns: `ToolCallParser` (text and calls out of streamed output, holding back only what may
still turn out to be a call's start or end), `ToolCall` and its events. Imports
api.http.openai.tools.spec and runtime.

A `ToolCall` is frozen: each event carries the call as it stood when the event was made, so a
"start" event shows no arguments even when the same `feed` went on to read some (the first
streamed Chat delta carries `"arguments": ""`, and only the "delta" events carry fragments;
a shared, growing call once sent its first fragment twice).
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from api.http.openai.tools.spec import CLOSE, OPEN, ToolSet, as_object
from runtime.sampling import SamplingParams


def output_prefix(sampling: SamplingParams) -> str:
    """The start of the output that the prompt holds instead (a forced call's opening,
    `Guide.prefix`): what a parser of the output reads first."""
    return sampling.guide.prefix if sampling.guide is not None else ""


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


@dataclass(frozen=True, slots=True)
class ToolCall:
    kind: str  # "function" | "custom"
    name: str
    call_id: str = field(default_factory=new_call_id)
    text: str = ""  # arguments (JSON text) or custom input, so far
    complete: bool = False


# Parser events: ("text", str, start) | ("start", ToolCall) | ("delta", ToolCall, str) | ("done", ToolCall);
# `start`: where the text begins in everything fed to the parser (for matching it to tokens).
Event = tuple[Any, ...]
_HERMES_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')
_NAMED_HEAD = re.compile(r'\s+name\s*=\s*"([^"]*)"\s*$')


class StepParser:
    """What every output parser shares: text fed in pieces is appended to `_buf` (`_fed` counts
    it) and read by `_step` until it can go no further; each subclass's `_step` says how."""

    _buf: str
    _fed: int

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        self._fed += len(text)
        events: list[Event] = []
        while self._step(events):
            pass
        return events

    def _step(self, events: list[Event]) -> bool:
        raise NotImplementedError


class ToolCallParser(StepParser):
    """Splits streamed output into text and tool calls, holding back only what might still
    turn out to be the start of a call (a partial `<tool_call`) or the end of one.

    Arguments stream as they are generated when the call is in the usual shape (name first);
    otherwise the call is parsed whole once it is closed. Whitespace between calls, and at the
    start of text that follows a call, is dropped. A text event carries where its text starts
    in everything fed so far (so a caller can tell which tokens made it), a call only names
    tools the model may call now (anything else stays text).

    `prefix`: the start of the output that the prompt already holds (a forced call's opening,
    `Guide.prefix`): read as if the model had written it, before anything fed. Text positions
    count from the first character fed.

    Under a forcing tool_choice (`required`, a named tool) there is no text at all: what is not
    a call (a second call cut by max_tokens before its name, `<tool_`, say) is dropped, never
    shown as the assistant's answer. A call cut after its name stays an incomplete call.
    """

    def __init__(self, toolset: ToolSet, prefix: str = "") -> None:
        self.toolset = toolset
        self.calls: list[ToolCall] = []
        self._names = {t.name for t in toolset.callable()}
        self._no_text = toolset.forcing
        self._buf = prefix  # always a suffix of the prefix and everything fed
        self._fed = 0  # characters fed so far
        self._state = "text"  # text | header | raw | hermes | args | tail
        self._call: ToolCall | None = None
        self._scan = _JsonScanner()
        self._hold = False
        self._ws = ""  # whitespace before a `<tool_call`: dropped if it is a call
        self._head = ""  # the `<tool_call ...>` header of the call being read
        self._after_call = False  # the next text follows a call: its leading whitespace goes
        self._steps: dict[str, Callable[[list[Event]], bool]] = {
            "text": self._in_text, "header": self._in_header, "raw": self._raw,
            "hermes": self._in_hermes, "args": self._args, "tail": self._in_tail,
        }


    def finish(self) -> list[Event]:
        """Flush at the end of output; a call cut off (e.g. by max tokens) stays incomplete."""
        events = self.feed("")  # a prefix nothing was fed after is read first
        buf, self._buf = self._buf, ""
        if self._state in ("text", "header"):
            ws = self._ws if self._state == "header" else ""
            self._text(events, ws + buf, self._fed - len(buf) - len(ws), final=True)
        elif self._state == "hermes":
            events += self._whole_hermes(buf, complete=False, start=self._fed - len(buf))
        elif self._call is not None:
            if self._state in ("raw", "args") and buf:
                self._delta(events, buf)
            self._set(replace(self._call, complete=self._state == "tail"))  # only the closing tag is missing
            if self._hold:
                events.append(("delta", self._call, self._call.text))
            events.append(("done", self._call))
        self._state, self._call = "text", None
        return events

    def _text(self, events: list[Event], text: str, start: int, final: bool = False) -> int:
        """Emit text that starts at `start`, minus the whitespace that follows a call (and, at
        the end, whitespace after calls). Returns how many characters of `text` it used."""
        lead = len(text) - len(text.lstrip()) if self._after_call else 0
        body = text[lead:]
        if self._no_text:
            return len(text)
        if not body or (final and self.calls and not body.strip()):
            return len(text) if final else lead
        events.append(("text", body, start + lead))
        self._after_call = False
        return len(text)

    # One transition; False when more input is needed. A state is the part of the format the
    # parser is in: text, a `<tool_call ...>` header, a custom tool's raw input, a Hermes
    # body before its arguments, the arguments' JSON, and the tail up to `</tool_call>`.
    def _step(self, events: list[Event]) -> bool:
        return self._steps[self._state](events)

    def _in_text(self, events: list[Event]) -> bool:
        buf = self._buf
        base = self._fed - len(buf)  # where buf starts
        at = buf.find(OPEN)
        if at < 0:
            keep = _partial_suffix(buf, OPEN)
            body = buf[: len(buf) - keep]
            if body.strip():  # trailing whitespace waits: it may come before a call
                used = self._text(events, body.rstrip(), base)
                self._buf = buf[used:]
            return False
        before = buf[:at]
        if before.strip():
            self._text(events, before.rstrip(), base)
        self._ws = before[len(before.rstrip()) :]
        self._buf, self._state = buf[at:], "header"
        return True

    def _in_header(self, events: list[Event]) -> bool:
        buf = self._buf
        end = buf.find(">")
        if end < 0:
            if len(buf) > 200:  # not a tool call after all
                return self._not_a_call(events)
            return False
        head = buf[len(OPEN) : end]
        if head.strip() == "":
            self._head = buf[: end + 1]
            self._buf, self._state = buf[end + 1 :], "hermes"
            return True
        m = _NAMED_HEAD.match(head)
        if m is None or m.group(1) not in self._names:
            return self._not_a_call(events)
        if len(buf) == end + 1:
            return False  # wait for the newline that follows the header
        rest = buf[end + 1 :]
        self._buf, self._state = rest[1:] if rest.startswith("\n") else rest, "raw"
        self._start(events, m.group(1), named=True)
        return True

    def _in_hermes(self, events: list[Event]) -> bool:
        buf = self._buf
        base = self._fed - len(buf)
        m = _HERMES_HEAD.match(buf)
        if m is not None:
            name = json.loads(f'"{m.group(1)}"')
            if name not in self._names:  # the header was text after all; so is the rest
                head = self._ws + self._head
                self._text(events, head, base - len(head))
                self._ws, self._state = "", "text"
                return True
            self._buf, self._state = buf[m.end() :], "args"
            self._start(events, name, named=False)
            return True
        if CLOSE in buf:
            at = buf.index(CLOSE)
            events += self._whole_hermes(buf[:at], complete=True, start=base)
            self._buf, self._state = buf[at + len(CLOSE) :], "text"
            return True
        return False

    def _in_tail(self, events: list[Event]) -> bool:
        """After a call's arguments, up to the closing tag."""
        buf = self._buf
        at = buf.find(CLOSE)
        if at < 0:
            self._buf = buf[len(buf) - _partial_suffix(buf, CLOSE) :]
            return False
        self._finish_call(events)
        self._buf, self._state = buf[at + len(CLOSE) :], "text"
        return True

    def _raw(self, events: list[Event]) -> bool:
        end = "\n" + CLOSE
        at = self._buf.find(end)
        if at < 0 and self._buf.startswith(CLOSE):  # an empty input: "\n" + CLOSE, newline eaten
            at, end = 0, CLOSE
        if at < 0:
            keep = _partial_suffix(self._buf, end)
            ready, self._buf = self._buf[: len(self._buf) - keep], self._buf[len(self._buf) - keep :]
            if ready:
                self._delta(events, ready)
            return False
        if at:
            self._delta(events, self._buf[:at])
        self._buf, self._state = self._buf[at + len(end) :], "text"
        self._finish_call(events)
        return True

    def _args(self, events: list[Event]) -> bool:
        if not self._scan.started:
            self._buf = self._buf.lstrip()
        used, done = self._scan.feed(self._buf)
        if used:
            self._delta(events, self._buf[:used])
            self._buf = self._buf[used:]
        if done:
            self._state = "tail"
            return True
        return False

    def _start(self, events: list[Event], name: str, named: bool) -> None:
        tool = self.toolset.get(name)
        if tool is None or name not in self._names:  # the callers check first; never under -O either
            raise RuntimeError(f"only callable tools start a call, not {name!r}")
        self._call = ToolCall(tool.kind, name)
        self._scan = _JsonScanner()
        self._hold = tool.kind == "custom" and not named  # a custom input written as JSON: decode at the end
        self._ws = ""
        self.calls.append(self._call)
        events.append(("start", self._call))

    def _set(self, call: ToolCall) -> None:
        """The call being read is now `call` (a new snapshot; events keep the ones they had)."""
        self._call = self.calls[-1] = call

    def _delta(self, events: list[Event], text: str) -> None:
        assert self._call is not None
        self._set(replace(self._call, text=self._call.text + text))
        if not self._hold:
            events.append(("delta", self._call, text))

    def _finish_call(self, events: list[Event]) -> None:
        call = self._call
        assert call is not None
        if self._hold:
            value = as_object(call.text)
            if isinstance(value, dict) and isinstance(value.get("input"), str):
                value = value["input"]
            if isinstance(value, str):
                call = replace(call, text=value)
            events.append(("delta", call, call.text))
        self._set(call := replace(call, complete=True))
        events.append(("done", call))
        self._call = None
        self._after_call = True

    def _whole_hermes(self, body: str, complete: bool, start: int) -> list[Event]:
        """A call not in the streaming-friendly shape: parse it whole, or give it back as text
        (also when it names a tool that may not be called). `start`: where `body` starts."""
        try:
            obj = json.loads(body)
            name = obj["name"]
            arguments = obj.get("arguments", obj.get("parameters", {}))
            if not isinstance(name, str) or name not in self._names:
                raise KeyError(name)
        except (ValueError, KeyError, TypeError):
            events: list[Event] = []
            head = self._ws + self._head
            self._text(events, head + body + (CLOSE if complete else ""), start - len(head))
            return events
        events = []
        self._start(events, name, named=False)
        self._hold = False
        assert self._call is not None
        text = arguments if isinstance(arguments, str) and self._call.kind == "custom" else json.dumps(arguments)
        self._delta(events, text)
        self._set(call := replace(self._call, complete=complete))
        events.append(("done", call))
        self._call = None
        self._after_call = True
        return events

    def _not_a_call(self, events: list[Event]) -> bool:
        base = self._fed - len(self._buf)
        self._text(events, self._ws + OPEN, base - len(self._ws))
        self._ws = ""
        self._buf, self._state = self._buf[len(OPEN) :], "text"
        return True


class _JsonScanner:
    """Finds where one JSON value ends in text that arrives piece by piece."""

    def __init__(self) -> None:
        self.depth = 0
        self.started = False
        self.in_string = False
        self.escape = False

    def feed(self, text: str) -> tuple[int, bool]:
        """(characters that belong to the value, whether the value is complete)."""
        for i, c in enumerate(text):
            if not self.started:
                if c.isspace():
                    continue
                self.started = True
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif c == "\\":
                    self.escape = True
                elif c == '"':
                    self.in_string = False
                    if self.depth == 0:
                        return i + 1, True
                continue
            if c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                if self.depth == 0:
                    return i, True
                self.depth -= 1
                if self.depth == 0:
                    return i + 1, True
            elif self.depth == 0 and (c in ",\n" or c.isspace()):
                return i, True  # the end of a bare number/true/false/null
        return len(text), False


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest suffix of text that is a proper prefix of marker."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
