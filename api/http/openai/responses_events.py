"""`ResponsesEventBuilder`: the Responses API's streaming events, as a pure state machine.

Owns: the order and shape of the events (as the openai SDK's `openai.types.responses` types
define them) and their increasing `sequence_number`:

    response.created → response.in_progress →
      per output item: response.output_item.added →
        message: response.content_part.added → response.output_text.delta* →
                 response.output_text.done → response.content_part.done
        function_call: response.function_call_arguments.delta* → .done
        custom_tool_call: response.custom_tool_call_input.delta* → .done
      → response.output_item.done
    → response.completed | response.incomplete | (error → response.failed)

A failed Response carries `error` as seed 001's Error table has it: `type`, `code` and `message`
(required) and `param` (null unless one request field caused it); the `error` event repeats
code, message and param. Log probabilities, when asked for, come per text delta in the shape
of the SDK's `ResponseOutputText.Logprob` (token, logprob, bytes, top_logprobs) on the part,
and without `bytes` (as `ResponseTextDeltaEvent.Logprob` has them) on the delta and done events.

The builder also keeps the Response object itself up to date, so a non-streaming request
runs the same builder and returns `builder.response`: both paths agree by construction.
No I/O, no clock reads except `completed_at`; ids come from `new_id`. Imports the stdlib only.
"""

from __future__ import annotations

import copy
import secrets
import time
from collections.abc import Callable
from typing import Any

Event = tuple[str, dict[str, Any]]  # (event name, payload with "type" == name)

_ITEM_PREFIX = {"message": "msg", "function_call": "fc", "custom_tool_call": "ctc"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


class ResponsesEventBuilder:
    def __init__(self, response: dict[str, Any], new_id: Callable[[str], str] = new_id) -> None:
        """`response`: the Response object so far (id, created_at, model, echoed settings)."""
        self.response = response
        self.response.update(status="in_progress", output=[], error=None, incomplete_details=None, usage=None)
        self._new_id = new_id
        self._seq = 0
        self._item: dict[str, Any] | None = None  # the output item being generated

    # -- life cycle ------------------------------------------------------------------------

    def start(self) -> list[Event]:
        return [self._response_event("response.created"), self._response_event("response.in_progress")]

    def finish(self, status: str, usage: dict[str, Any] | None = None, incomplete_reason: str | None = None) -> list[Event]:
        """Close what is open and end with response.completed (or .incomplete)."""
        assert status in ("completed", "incomplete")
        events = self._close_item(complete=status == "completed")
        self.response["status"] = status
        self.response["usage"] = usage
        self.response["completed_at"] = int(time.time())
        if status == "incomplete":
            self.response["incomplete_details"] = {"reason": incomplete_reason or "max_output_tokens"}
        events.append(self._response_event(f"response.{status}"))
        return events

    def fail(
        self, message: str, code: str = "server_error", type_: str = "server_error", param: str | None = None, usage: dict[str, Any] | None = None
    ) -> list[Event]:
        """The request failed mid-way: an error event, then response.failed (with the usage so
        far, where it is known).

        `code` must be one of the SDK's `ResponseError.code` values ("server_error" for any
        failure inside the engine)."""
        events = self._close_item(complete=False)
        events.append(self._event("error", code=code, message=message, param=param))
        self.response["status"] = "failed"
        self.response["error"] = {"type": type_, "code": code, "message": message, "param": param}
        self.response["usage"] = usage
        self.response["completed_at"] = None
        events.append(self._response_event("response.failed"))
        return events

    # -- output ----------------------------------------------------------------------------

    def text(self, delta: str, logprobs: list[dict[str, Any]] | None = None) -> list[Event]:
        """Text for the current message (opened if need be). `logprobs`: the tokens that made
        this text, in the output_text part's shape (token, logprob, bytes, top_logprobs)."""
        if not delta:
            return []
        events: list[Event] = []
        if self._item is None or self._item["type"] != "message":
            events += self._close_item(complete=True)
            events += self._open_message()
        item = self._item
        assert item is not None  # _open_message made it
        part = item["content"][0]
        part["text"] += delta
        part["logprobs"] += logprobs or []
        events.append(self._event("response.output_text.delta", **self._where(), content_index=0, delta=delta, logprobs=_event_logprobs(logprobs or [])))
        return events

    def call_start(self, kind: str, name: str, call_id: str) -> list[Event]:
        """Open a function_call (kind "function") or custom_tool_call (kind "custom") item."""
        events = self._close_item(complete=True)
        if kind == "function":
            item = {"type": "function_call", "status": "in_progress", "arguments": "", "call_id": call_id, "name": name}
        else:
            item = {"type": "custom_tool_call", "status": "in_progress", "input": "", "call_id": call_id, "name": name}
        events.append(self._add_item(item))
        return events

    def call_delta(self, delta: str) -> list[Event]:
        item = self._item
        assert item is not None and item["type"] != "message", "call_delta outside a call"
        if not delta:
            return []
        if item["type"] == "function_call":
            item["arguments"] += delta
            return [self._event("response.function_call_arguments.delta", **self._where(), delta=delta)]
        item["input"] += delta
        return [self._event("response.custom_tool_call_input.delta", **self._where(), delta=delta)]

    def call_done(self, complete: bool = True) -> list[Event]:
        return self._close_item(complete)

    # -- internals -------------------------------------------------------------------------

    def _open_message(self) -> list[Event]:
        item: dict[str, Any] = {"type": "message", "role": "assistant", "status": "in_progress", "content": []}
        events = [self._add_item(item)]
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        item["content"].append(part)
        events.append(self._event("response.content_part.added", **self._where(), content_index=0, part=copy.deepcopy(part)))
        return events

    def _add_item(self, item: dict[str, Any]) -> Event:
        item = {"id": self._new_id(_ITEM_PREFIX[item["type"]]), **item}
        self.response["output"].append(item)
        self._item = item
        return self._event("response.output_item.added", output_index=len(self.response["output"]) - 1, item=copy.deepcopy(item))

    def _close_item(self, complete: bool) -> list[Event]:
        item = self._item
        if item is None:
            return []
        self._item = None
        where = {"item_id": item["id"], "output_index": self.response["output"].index(item)}
        events: list[Event] = []
        if item["type"] == "message":
            part = item["content"][0]
            events.append(self._event("response.output_text.done", **where, content_index=0, text=part["text"], logprobs=_event_logprobs(part["logprobs"])))
            events.append(self._event("response.content_part.done", **where, content_index=0, part=copy.deepcopy(part)))
        elif item["type"] == "function_call":
            events.append(self._event("response.function_call_arguments.done", **where, arguments=item["arguments"]))
        else:
            events.append(self._event("response.custom_tool_call_input.done", **where, input=item["input"]))
        item["status"] = "completed" if complete else "incomplete"
        events.append(self._event("response.output_item.done", output_index=where["output_index"], item=copy.deepcopy(item)))
        return events

    def _where(self) -> dict[str, Any]:
        assert self._item is not None
        return {"item_id": self._item["id"], "output_index": len(self.response["output"]) - 1}

    def _response_event(self, name: str) -> Event:
        return self._event(name, response=copy.deepcopy(self.response))

    def _event(self, name: str, **fields: Any) -> Event:
        payload = {"type": name, "sequence_number": self._seq, **fields}
        self._seq += 1
        return name, payload


def _event_logprobs(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Part-shaped logprobs as the delta and done events type them (no `bytes`)."""
    return [
        {"token": e["token"], "logprob": e["logprob"], "top_logprobs": [{"token": t["token"], "logprob": t["logprob"]} for t in e["top_logprobs"]]}
        for e in entries
    ]
