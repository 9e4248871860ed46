"""The Responses API's stream: its typed events, and `ResponsesEventBuilder`, the pure state
machine that makes them.

Owns: the order and shape of the events (as the openai SDK's `openai.types.responses` types
define them) and their increasing `sequence_number`:

    response.created → response.in_progress →
      per output item: response.output_item.added →
        reasoning: response.reasoning_text.delta* → response.reasoning_text.done
        message: response.content_part.added → response.output_text.delta* →
                 response.output_text.done → response.content_part.done
        function_call: response.function_call_arguments.delta* → .done
        custom_tool_call: response.custom_tool_call_input.delta* → .done
      → response.output_item.done
    → response.completed | response.incomplete | (error → response.failed)

The builder also keeps the Response object itself up to date, so a non-streaming request runs
the same builder and returns `builder.response`: both paths agree by construction. No I/O, no
clock reads except `completed_at`; ids come from `new_id`. Imports msgspec and api.http.openai.
"""

from __future__ import annotations

import copy
import secrets
import time
from collections.abc import Callable
from typing import Any

import msgspec

from api.http.openai.common.logprobs import TokenLogprob
from api.http.openai.responses.response import (
    CustomToolCallItem,
    FunctionCallItem,
    IncompleteDetails,
    MessageItem,
    OutputItem,
    OutputText,
    ReasoningItem,
    ReasoningText,
    ResponseError,
    ResponseObject,
    ResponseUsage,
)


class ResponseEvent(msgspec.Struct, kw_only=True, tag_field="type"):
    sequence_number: int


class _Snapshot(ResponseEvent, kw_only=True):
    response: ResponseObject


class Created(_Snapshot, tag="response.created"): ...
class InProgress(_Snapshot, tag="response.in_progress"): ...
class Completed(_Snapshot, tag="response.completed"): ...
class Incomplete(_Snapshot, tag="response.incomplete"): ...
class Failed(_Snapshot, tag="response.failed"): ...


class OutputItemAdded(ResponseEvent, kw_only=True, tag="response.output_item.added"):
    output_index: int
    item: OutputItem


class OutputItemDone(OutputItemAdded, tag="response.output_item.done"): ...


class _InItem(ResponseEvent, kw_only=True):
    item_id: str
    output_index: int


class ContentPartAdded(_InItem, kw_only=True, tag="response.content_part.added"):
    content_index: int = 0
    part: OutputText


class ContentPartDone(ContentPartAdded, tag="response.content_part.done"): ...


class EventTopLogprob(msgspec.Struct):
    token: str
    logprob: float


class EventLogprob(msgspec.Struct):
    """`ResponseTextDeltaEvent.Logprob`: the part's entry without `bytes`."""

    token: str
    logprob: float
    top_logprobs: list[EventTopLogprob]


class OutputTextDelta(_InItem, kw_only=True, tag="response.output_text.delta"):
    content_index: int = 0
    delta: str
    logprobs: list[EventLogprob]


class OutputTextDone(_InItem, kw_only=True, tag="response.output_text.done"):
    content_index: int = 0
    text: str
    logprobs: list[EventLogprob]


class ArgumentsDelta(_InItem, kw_only=True, tag="response.function_call_arguments.delta"):
    delta: str


class ArgumentsDone(_InItem, kw_only=True, tag="response.function_call_arguments.done"):
    arguments: str


class CustomInputDelta(_InItem, kw_only=True, tag="response.custom_tool_call_input.delta"):
    delta: str


class CustomInputDone(_InItem, kw_only=True, tag="response.custom_tool_call_input.done"):
    input: str


class ReasoningTextDelta(_InItem, kw_only=True, tag="response.reasoning_text.delta"):
    content_index: int = 0
    delta: str


class ReasoningTextDone(_InItem, kw_only=True, tag="response.reasoning_text.done"):
    content_index: int = 0
    text: str


class ErrorEvent(ResponseEvent, kw_only=True, tag="error"):
    code: str
    message: str
    param: str | None


Event = tuple[str, ResponseEvent]  # (event name, its payload, whose "type" is the name)

_ITEM_PREFIX = {MessageItem: "msg", FunctionCallItem: "fc", CustomToolCallItem: "ctc", ReasoningItem: "rs"}
_END = {"completed": Completed, "incomplete": Incomplete}


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def event_name(event: ResponseEvent) -> str:
    tag = event.__struct_config__.tag
    assert isinstance(tag, str)
    return tag


# A failed Response carries `error` as the Databricks Foundation Model API's Error table has it
# (responses/response.py `ResponseError`); the `error` event repeats code, message and param.
# Log probabilities, when asked for, come per text delta in the shape of the SDK's
# `ResponseOutputText.Logprob` (token, logprob, bytes, top_logprobs) on the part, and without
# `bytes` (as `ResponseTextDeltaEvent.Logprob` has them) on the delta and done events. An event
# carries a copy of what it shows, so later changes never reach an event already made.
class ResponsesEventBuilder:
    def __init__(self, response: ResponseObject, new_id: Callable[[str], str] = new_id) -> None:
        """`response`: the Response object so far (id, created_at, model, repeated settings)."""
        self.response = response
        self._update(status="in_progress", output=[], error=None, incomplete_details=None, usage=None, completed_at=msgspec.UNSET)
        self._new_id = new_id
        self._seq = 0
        self._item: OutputItem | None = None  # the output item being generated

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> list[Event]:
        return [self._snapshot(Created), self._snapshot(InProgress)]

    def finish(self, status: str, usage: ResponseUsage | None = None, incomplete_reason: str | None = None) -> list[Event]:
        """Close what is open and end with response.completed (or .incomplete)."""
        assert status in _END
        events = self._close_item(complete=status == "completed")
        details = IncompleteDetails(incomplete_reason or "max_output_tokens") if status == "incomplete" else None
        self._update(status=status, usage=usage, completed_at=int(time.time()), incomplete_details=details)
        events.append(self._snapshot(_END[status]))
        return events

    def fail(
        self, message: str, code: str = "server_error", type_: str = "server_error", param: str | None = None, usage: ResponseUsage | None = None
    ) -> list[Event]:
        """The request failed mid-way: an error event, then response.failed (with the usage so
        far, where it is known).

        `code` must be one of the SDK's `ResponseError.code` values ("server_error" for any
        failure inside the engine)."""
        events = self._close_item(complete=False)
        events.append(self._event(ErrorEvent, code=code, message=message, param=param))
        error = ResponseError(type=type_, code=code, message=message, param=param)
        self._update(status="failed", error=error, usage=usage, completed_at=None)
        events.append(self._snapshot(Failed))
        return events

    # -- output ----------------------------------------------------------------------------

    def text(self, delta: str, logprobs: list[TokenLogprob] | None = None) -> list[Event]:
        """Text for the current message (opened if need be). `logprobs`: the tokens that made
        this text, in the output_text part's shape (token, logprob, bytes, top_logprobs)."""
        if not delta:
            return []
        events: list[Event] = []
        if not isinstance(self._item, MessageItem):
            events += self._close_item(complete=True)
            events += self._open_message()
        item = self._item
        assert isinstance(item, MessageItem)  # _open_message made it
        part = item.content[0]
        part.text += delta
        part.logprobs += logprobs or []
        events.append(self._event(OutputTextDelta, **self._where(), delta=delta, logprobs=_event_logprobs(logprobs or [])))
        return events

    def reasoning(self, delta: str) -> list[Event]:
        """Thinking for the current reasoning item (opened if need be)."""
        if not delta:
            return []
        events: list[Event] = []
        if not isinstance(self._item, ReasoningItem):
            events += self._close_item(complete=True)
            events.append(self._add_item(ReasoningItem(id=self._new_id(_ITEM_PREFIX[ReasoningItem]), content=[ReasoningText()])))
        item = self._item
        assert isinstance(item, ReasoningItem)
        item.content[0].text += delta
        events.append(self._event(ReasoningTextDelta, **self._where(), delta=delta))
        return events

    def call_start(self, kind: str, name: str, call_id: str) -> list[Event]:
        """Open a function_call (kind "function") or custom_tool_call (kind "custom") item."""
        events = self._close_item(complete=True)
        kind_of = FunctionCallItem if kind == "function" else CustomToolCallItem
        events.append(self._add_item(kind_of(id=self._new_id(_ITEM_PREFIX[kind_of]), call_id=call_id, name=name)))
        return events

    def call_delta(self, delta: str) -> list[Event]:
        item = self._item
        assert isinstance(item, FunctionCallItem | CustomToolCallItem), "call_delta outside a call"
        if not delta:
            return []
        if isinstance(item, FunctionCallItem):
            item.arguments += delta
            return [self._event(ArgumentsDelta, **self._where(), delta=delta)]
        item.input += delta
        return [self._event(CustomInputDelta, **self._where(), delta=delta)]

    def call_done(self, complete: bool = True) -> list[Event]:
        return self._close_item(complete)

    # -- internals -------------------------------------------------------------------------

    def _open_message(self) -> list[Event]:
        item = MessageItem(id=self._new_id(_ITEM_PREFIX[MessageItem]))
        events = [self._add_item(item)]
        part = OutputText()
        item.content.append(part)
        events.append(self._event(ContentPartAdded, **self._where(), part=copy.deepcopy(part)))
        return events

    def _add_item(self, item: OutputItem) -> Event:
        self.response.output.append(item)
        self._item = item
        return self._event(OutputItemAdded, output_index=len(self.response.output) - 1, item=copy.deepcopy(item))

    def _close_item(self, complete: bool) -> list[Event]:
        item = self._item
        if item is None:
            return []
        self._item = None
        index = self.response.output.index(item)
        where: dict[str, Any] = {"item_id": item.id, "output_index": index}
        events: list[Event] = []
        if isinstance(item, MessageItem):
            part = item.content[0]
            events.append(self._event(OutputTextDone, **where, text=part.text, logprobs=_event_logprobs(part.logprobs)))
            events.append(self._event(ContentPartDone, **where, part=copy.deepcopy(part)))
        elif isinstance(item, FunctionCallItem):
            events.append(self._event(ArgumentsDone, **where, arguments=item.arguments))
        elif isinstance(item, ReasoningItem):
            events.append(self._event(ReasoningTextDone, **where, text=item.content[0].text))
        else:
            events.append(self._event(CustomInputDone, **where, input=item.input))
        done = msgspec.structs.replace(item, status="completed" if complete else "incomplete")
        self.response.output[index] = done
        events.append(self._event(OutputItemDone, output_index=index, item=copy.deepcopy(done)))
        return events

    def _update(self, **state: Any) -> None:
        """The Response's state, changed (a new object: the events made so far hold copies)."""
        self.response = msgspec.structs.replace(self.response, **state)

    def _where(self) -> dict[str, Any]:
        assert self._item is not None
        return {"item_id": self._item.id, "output_index": len(self.response.output) - 1}

    def _snapshot(self, kind: type[_Snapshot]) -> Event:
        return self._event(kind, response=copy.deepcopy(self.response))

    def _event(self, kind: type[ResponseEvent], **fields: Any) -> Event:
        event = kind(sequence_number=self._seq, **fields)
        self._seq += 1
        return event_name(event), event


def _event_logprobs(entries: list[TokenLogprob]) -> list[EventLogprob]:
    """Part-shaped logprobs as the delta and done events type them (no `bytes`)."""
    return [EventLogprob(e.token, e.logprob, [EventTopLogprob(t.token, t.logprob) for t in e.top_logprobs]) for e in entries]
