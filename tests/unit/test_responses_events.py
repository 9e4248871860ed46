"""`ResponsesEventBuilder` on its own: order, sequence numbers, and every event and the final
Response validated strictly against the openai SDK's pydantic types."""

from __future__ import annotations

import itertools
from typing import Any

import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from api.http.openai.responses_events import Event, ResponsesEventBuilder

EVENT = pydantic.TypeAdapter(ResponseStreamEvent)
USAGE = {
    "input_tokens": 5,
    "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
    "output_tokens": 3,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 8,
}


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
    return ResponsesEventBuilder(skeleton, new_id=lambda prefix: f"{prefix}_{next(counter)}")


def check(events: list[Event]) -> list[str]:
    for i, (name, payload) in enumerate(events):
        assert payload["type"] == name and payload["sequence_number"] == i
        EVENT.validate_python(payload)
    return [name for name, _ in events]


def test_text_only() -> None:
    b = builder()
    events = b.start() + b.text("Hel") + b.text("") + b.text("lo") + b.finish("completed", USAGE)
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
    response = Response.model_validate(b.response)
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
    assert names.count("response.output_item.added") == 3 == names.count("response.output_item.done")
    assert "response.function_call_arguments.done" in names and "response.custom_tool_call_input.done" in names
    response = Response.model_validate(b.response)
    message, fc, ctc = response.output
    assert (message.id, fc.id, ctc.id) == ("msg_0", "fc_1", "ctc_2")
    assert fc.arguments == '{"city":"Paris"}' and fc.call_id == "call_a" and fc.status == "completed"
    assert ctc.input == "*** Begin" and ctc.call_id == "call_b"
    indexes = [p["output_index"] for n, p in events if n == "response.output_item.done"]
    assert indexes == [0, 1, 2]


def test_incomplete_closes_open_items() -> None:
    b = builder()
    events = b.start() + b.call_start("function", "f", "call_1") + b.call_delta('{"a": 1') + b.finish("incomplete", USAGE)
    check(events)
    response = Response.model_validate(b.response)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].status == "incomplete"


def test_failure() -> None:
    b = builder()
    events = b.start() + b.text("partial") + b.fail("device error")
    names = check(events)
    assert names[-2:] == ["error", "response.failed"]
    response = Response.model_validate(b.response)
    assert response.status == "failed" and response.error.message == "device error" and response.error.code == "server_error"
    # Seed 001's Error: type, code and message required, param when a field caused it.
    assert b.response["error"] == {"type": "server_error", "code": "server_error", "message": "device error", "param": None}
    assert events[-2][1]["code"] == "server_error" and events[-2][1]["param"] is None


def test_logprobs_on_the_part_and_the_events() -> None:
    """The part holds the SDK's ResponseOutputText.Logprob (with bytes); the delta and done
    events hold their own Logprob shape (no bytes), strictly valid both."""
    entry = {"token": "Hi", "logprob": -0.25, "bytes": [72, 105], "top_logprobs": [{"token": "Yo", "logprob": -2.0, "bytes": [89, 111]}]}
    b = builder()
    events = b.start() + b.text("Hi", [entry]) + b.text("!", []) + b.finish("completed", USAGE)
    for _, payload in events:
        EVENT.validate_python(payload, strict=True)
    delta = next(p for n, p in events if n == "response.output_text.delta")
    assert delta["logprobs"] == [{"token": "Hi", "logprob": -0.25, "top_logprobs": [{"token": "Yo", "logprob": -2.0}]}]
    done = next(p for n, p in events if n == "response.output_text.done")
    assert done["logprobs"] == delta["logprobs"]
    response = Response.model_validate(b.response, strict=True)
    assert [lp.model_dump() for lp in response.output[0].content[0].logprobs] == [entry]


def test_delta_outside_a_call_is_a_bug() -> None:
    b = builder()
    b.start()
    with pytest.raises(AssertionError):
        b.call_delta("x")
