"""`ResponsesEventBuilder` on its own: order, sequence numbers, and every event and the final
Response validated strictly against the openai SDK's pydantic types (as the client reads them:
the typed events and Response turned into JSON values, `wire`)."""

from __future__ import annotations

import itertools
from typing import Any

import msgspec
import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from api.http.openai.common.logprobs import TokenLogprob
from api.http.openai.responses.events import Event, ResponsesEventBuilder
from api.http.openai.responses.response import ResponseObject, ResponseUsage

EVENT = pydantic.TypeAdapter(ResponseStreamEvent)
USAGE = msgspec.convert(
    {
        "input_tokens": 5,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 8,
    },
    ResponseUsage,
)


def builder() -> ResponsesEventBuilder:
    counter = itertools.count()
    skeleton: dict[str, Any] = {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "model": "m",
        "tools": [],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
    }
    return ResponsesEventBuilder(msgspec.convert(skeleton, ResponseObject), new_id=lambda prefix: f"{prefix}_{next(counter)}")


def wire(events: list[Event]) -> list[tuple[str, dict[str, Any]]]:
    """The events as the client reads them (JSON values)."""
    return [(name, msgspec.to_builtins(payload)) for name, payload in events]


def response_of(b: ResponsesEventBuilder) -> dict[str, Any]:
    """The builder's Response as the client reads it."""
    out: dict[str, Any] = msgspec.to_builtins(b.response)
    return out


def check(typed: list[Event]) -> list[str]:
    events = wire(typed)
    for i, (name, payload) in enumerate(events):
        assert payload["type"] == name and payload["sequence_number"] == i
        EVENT.validate_python(payload)
    return [name for name, _ in events]


def test_text_only() -> None:
    b = builder()
    events = wire(b.start() + b.text("Hel") + b.text("") + b.text("lo") + b.finish("completed", USAGE))
    assert check(events) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    response = Response.model_validate(response_of(b))
    assert response.output_text == "Hello" and response.status == "completed" and response.usage.total_tokens == 8
    assert events[0][1]["response"]["status"] == "in_progress" and events[0][1]["response"]["output"] == []
    added = events[2][1]["item"]
    assert added["status"] == "in_progress" and added["content"] == []
    assert events[-2][1]["item"]["status"] == "completed" and events[-2][1]["item"]["content"][0]["text"] == "Hello"


def test_text_then_calls() -> None:
    b = builder()
    events = b.start() + b.text("Sure.")
    events += b.call_start("function", "get_weather", "call_a") + b.call_delta('{"city":') + b.call_delta('"Paris"}') + b.call_done()
    events += b.call_start("custom", "apply_patch", "call_b") + b.call_delta("*** Begin") + b.call_done()
    events += b.finish("completed", USAGE)
    names = check(events)
    wired = wire(events)
    assert names.count("response.output_item.added") == 3 == names.count("response.output_item.done")
    assert "response.function_call_arguments.done" in names and "response.custom_tool_call_input.done" in names
    response = Response.model_validate(response_of(b))
    message, fc, ctc = response.output
    assert (message.id, fc.id, ctc.id) == ("msg_0", "fc_1", "ctc_2")
    assert fc.arguments == '{"city":"Paris"}' and fc.call_id == "call_a" and fc.status == "completed"
    assert ctc.input == "*** Begin" and ctc.call_id == "call_b"
    indexes = [p["output_index"] for n, p in wired if n == "response.output_item.done"]
    assert indexes == [0, 1, 2]


def test_incomplete_closes_open_items() -> None:
    b = builder()
    events = b.start() + b.call_start("function", "f", "call_1") + b.call_delta('{"a": 1') + b.finish("incomplete", USAGE)
    check(events)
    response = Response.model_validate(response_of(b))
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].status == "incomplete"


def test_failure() -> None:
    b = builder()
    events = wire(b.start() + b.text("partial") + b.fail("device error"))
    names = check(events)
    assert names[-2:] == ["error", "response.failed"]
    response = Response.model_validate(response_of(b))
    assert response.status == "failed" and response.error.message == "device error" and response.error.code == "server_error"
    # The Responses API reference's Error: type, code and message required, param when a field caused it.
    assert response_of(b)["error"] == {"type": "server_error", "code": "server_error", "message": "device error", "param": None}
    assert events[-2][1]["code"] == "server_error" and events[-2][1]["param"] is None


def test_logprobs_on_the_part_and_the_events() -> None:
    """The part holds the SDK's ResponseOutputText.Logprob (with bytes); the delta and done
    events hold their own Logprob shape (no bytes), strictly valid both."""
    entry = {"token": "Hi", "logprob": -0.25, "bytes": [72, 105], "top_logprobs": [{"token": "Yo", "logprob": -2.0, "bytes": [89, 111]}]}
    b = builder()
    events = wire(b.start() + b.text("Hi", [msgspec.convert(entry, TokenLogprob)]) + b.text("!", []) + b.finish("completed", USAGE))
    for _, payload in events:
        EVENT.validate_python(payload, strict=True)
    delta = next(p for n, p in events if n == "response.output_text.delta")
    assert delta["logprobs"] == [{"token": "Hi", "logprob": -0.25, "top_logprobs": [{"token": "Yo", "logprob": -2.0}]}]
    done = next(p for n, p in events if n == "response.output_text.done")
    assert done["logprobs"] == delta["logprobs"]
    response = Response.model_validate(response_of(b), strict=True)
    assert [lp.model_dump() for lp in response.output[0].content[0].logprobs] == [entry]


def test_delta_outside_a_call_is_a_bug() -> None:
    b = builder()
    b.start()
    with pytest.raises(AssertionError):
        b.call_delta("x")
