"""The Responses API on the wire: every SSE event and every body, validated strictly against the
openai SDK's pydantic types (the SDK itself builds its objects without validating them), and
the behaviours around them: failures, logprobs, undeclared tools, what reaches the prompt,
and truncation.

Model output is scripted (tests/support/scripted.py) unless a test needs the real engine.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pydantic
import pytest
from openai.types.responses import Response, ResponseCustomToolCall, ResponseStreamEvent

import api.http.openai.responses.view
from actors.tokenizer import encode_prompt
from api.http.openai.tools.spec import format_call
from runtime.messages import FinishReason
from tests.support.scripted import Script
from tests.support.servers import Server
from tests.support.waiting import in_thread

EVENT = pydantic.TypeAdapter(ResponseStreamEvent)
RESPONSE = pydantic.TypeAdapter(Response)
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False},
}
SQL = {"type": "custom", "name": "run_sql", "description": "Run SQL."}
CALL = format_call("function", "get_weather", '{"city": "Paris"}')


def script(monkeypatch: pytest.MonkeyPatch, text: str, step: int = 3, **kwargs: Any) -> Script:
    s = Script([text[i : i + step] for i in range(0, len(text), step)], **kwargs)
    monkeypatch.setattr(api.http.openai.responses.view, "Generation", s)
    return s


def extras(obj: Any, path: str = "$") -> list[str]:
    """Fields the SDK's types do not define, anywhere in a validated object, but for two that
    the Databricks reference's Responses tables list and this SDK version does not: the Response's `store` and the
    custom_tool_call item's `status`."""
    if isinstance(obj, pydantic.BaseModel):
        allowed = {"store"} if isinstance(obj, Response) else {"status"} if isinstance(obj, ResponseCustomToolCall) else set()
        found = [f"{path}.{k}" for k in obj.model_extra or {} if k not in allowed]
        for name in type(obj).model_fields:
            found += extras(getattr(obj, name), f"{path}.{name}")
        return found
    if isinstance(obj, list):
        return [e for i, v in enumerate(obj) for e in extras(v, f"{path}[{i}]")]
    if isinstance(obj, dict):
        return [e for k, v in obj.items() for e in extras(v, f"{path}.{k}")]
    return []


def strict_event(payload: dict[str, Any]) -> Any:
    event = EVENT.validate_python(payload, strict=True)
    assert not extras(event), (payload["type"], extras(event))
    assert event.model_dump(mode="json", exclude_unset=True) == payload  # nothing lost or coerced
    return event


def strict_response(body: dict[str, Any]) -> Response:
    response = RESPONSE.validate_python(body, strict=True)
    assert not extras(response), extras(response)
    return response


async def sse(server: Server, body: dict[str, Any]) -> list[Any]:
    """POST a streaming request; every event, validated strictly, in order."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        async with http.stream("POST", "/v1/responses", json={"model": "tiny", "stream": True, **body}) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            raw = (await r.aread()).decode()
    events = []
    for block in filter(None, raw.split("\n\n")):
        name_line, data_line = block.split("\n")
        assert name_line.startswith("event: ") and data_line.startswith("data: ")
        payload = json.loads(data_line[6:])
        assert payload["type"] == name_line[7:]
        events.append(strict_event(payload))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return events


async def post(server: Server, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        r = await http.post("/v1/responses", json={"model": "tiny", **body})
    return r.status_code, r.json()


# -- every streamed event validates ----------------------------------------------------------


async def test_text_answer_events_validate(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    script(monkeypatch, "Hello there, friend.", logprobs=True)
    events = await sse(server, {"input": "hi", "top_logprobs": 1, "stream_options": {"include_usage": True}})
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"]
    final = events[-1].response
    strict_response(final.model_dump(mode="json", exclude_unset=True))
    assert final.output_text == "Hello there, friend." and final.usage is not None
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert all(len(e.logprobs) == 1 and e.logprobs[0].top_logprobs for e in deltas)
    assert len(final.output[0].content[0].logprobs) == len(deltas)


async def test_function_call_events_validate(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    script(monkeypatch, "Checking.\n" + CALL, step=2)
    events = await sse(server, {"input": "Weather?", "tools": [WEATHER]})
    types = [e.type for e in events]
    assert "response.function_call_arguments.delta" in types and types[-1] == "response.completed"
    message, call = events[-1].response.output
    assert message.content[0].text == "Checking." and call.type == "function_call" and json.loads(call.arguments) == {"city": "Paris"}


async def test_custom_tool_events_validate(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    script(monkeypatch, format_call("custom", "run_sql", "SELECT 1;"), step=4)
    events = await sse(server, {"input": "Count.", "tools": [SQL], "tool_choice": {"type": "custom", "name": "run_sql"}})
    assert "response.custom_tool_call_input.delta" in [e.type for e in events]
    [call] = events[-1].response.output
    assert call.type == "custom_tool_call" and call.input == "SELECT 1;" and call.status == "completed"


async def test_incomplete_events_validate(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    script(monkeypatch, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa', finish=FinishReason.LENGTH)
    events = await sse(server, {"input": "x", "tools": [WEATHER], "max_output_tokens": 9})
    final = events[-1]
    assert final.type == "response.incomplete" and final.response.incomplete_details.reason == "max_output_tokens"
    assert final.response.output[0].status == "incomplete"


async def test_failure_mid_stream_events_validate(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    script(monkeypatch, "Partial answer that never ends", fail_at=3)
    events = await sse(server, {"input": "x"})
    assert [e.type for e in events[-3:]] == ["response.output_item.done", "error", "response.failed"]
    failed = events[-1].response
    assert failed.status == "failed" and failed.output[0].status == "incomplete"
    assert failed.error.code == "server_error" and failed.error.type == "server_error" and "scripted failure" in failed.error.message
    assert events[-2].code == "server_error" and events[-2].message == failed.error.message


# -- failures: a failed Response, streamed or not ---------------------------------------------


@pytest.mark.parametrize("fail_at", [0, 2])
async def test_non_streaming_failure_is_a_failed_response(server: Server, monkeypatch: pytest.MonkeyPatch, fail_at: int) -> None:
    """The Responses API reference: a Response that did not succeed has status "failed" and an
    `error` with type, code and message (param when a field caused it); not an HTTP 500."""
    script(monkeypatch, "Some text before it broke.", fail_at=fail_at)
    status, body = await post(server, {"input": "x"})
    assert status == 200, body
    response = strict_response(body)
    assert response.status == "failed" and response.error is not None
    assert body["error"].keys() == {"type", "code", "message", "param"}
    assert body["error"]["type"] == "server_error" and body["error"]["code"] == "server_error" and body["error"]["param"] is None
    assert "scripted failure" in body["error"]["message"]
    if fail_at:  # what was made before the failure is kept, marked incomplete
        assert response.output[0].status == "incomplete" and response.output[0].content[0].text == "Some t"
    else:
        assert response.output == []
    events = await sse(server, {"input": "x"})
    assert events[-1].type == "response.failed" and events[-1].response.error.message == body["error"]["message"]


# -- logprobs ----------------------------------------------------------------------------------


async def test_logprobs_go_with_the_text_they_made(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """With tools, only the tokens that made message text are reported, each once."""
    text = "Let me look.\n" + CALL + "\nDone."
    s = script(monkeypatch, text, step=4, logprobs=True)
    events = await sse(server, {"input": "x", "tools": [WEATHER], "include": ["message.output_text.logprobs"]})
    final = events[-1].response
    first, call, last = final.output
    assert first.content[0].text == "Let me look." and call.type == "function_call" and last.content[0].text == "Done."
    assert s.calls[0][1].logprobs == 0  # include without top_logprobs: the chosen token only
    # Piece i (characters 4i..4i+3) carries logprob -i; a message gets the pieces its text overlaps.
    start_done = text.rindex("Done.")
    want_first = [-float(i) for i in range(len(s.pieces)) if 4 * i < len("Let me look.")]
    want_last = [-float(i) for i in range(len(s.pieces)) if 4 * i + 4 > start_done]
    assert [lp.logprob for lp in first.content[0].logprobs] == want_first
    assert [lp.logprob for lp in last.content[0].logprobs] == want_last
    streamed = [lp.logprob for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    assert streamed == want_first + want_last
    done = [e for e in events if e.type == "response.output_text.done"]
    assert [lp.logprob for lp in done[0].logprobs] == want_first


async def test_no_logprobs_unless_asked(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    s = script(monkeypatch, "Hello.", logprobs=True)
    status, body = await post(server, {"input": "x"})
    assert status == 200 and body["output"][0]["content"][0]["logprobs"] == [] and s.calls[0][1].logprobs is None


async def test_top_logprobs_on_the_real_engine_match_chat(client: openai.OpenAI) -> None:
    """Greedy, the same messages: the Responses logprobs are Chat's, token for token."""
    resp = await in_thread(
        client.responses.create, model="tiny", input=[{"role": "user", "content": "count"}], max_output_tokens=6, temperature=0, top_logprobs=3
    )
    chat = await in_thread(
        client.chat.completions.create,
        model="tiny",
        messages=[{"role": "user", "content": "count"}],
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    part = resp.output[0].content[0]
    assert resp.top_logprobs == 3 and part.text == chat.choices[0].message.content
    ours = [(lp.token, round(lp.logprob, 4), lp.bytes, [(t.token, round(t.logprob, 4)) for t in lp.top_logprobs]) for lp in part.logprobs]
    theirs = [(lp.token, round(lp.logprob, 4), lp.bytes, [(t.token, round(t.logprob, 4)) for t in lp.top_logprobs]) for lp in chat.choices[0].logprobs.content]
    n = len(ours)
    assert n >= 1 and ours == theirs[:n] and n >= len(theirs) - 1  # Chat may also list the EOS token
    assert all(len(lp.top_logprobs) == 3 for lp in part.logprobs)


# -- undeclared tools --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        format_call("function", "delete_everything", '{"really": true}'),
        format_call("custom", "rm_rf", "/"),
        '<tool_call>\n{"arguments": {}, "name": "delete_everything"}\n</tool_call>',
    ],
)
async def test_a_call_to_an_undeclared_tool_is_text(client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    script(monkeypatch, text, step=2)
    resp = await in_thread(client.responses.create, model="tiny", input="x", tools=[WEATHER, SQL])
    assert [item.type for item in resp.output] == ["message"]
    assert resp.output_text == text


async def test_text_after_a_call_has_no_leading_newline(client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    script(monkeypatch, CALL + "\n\nAll done.", step=2)
    resp = await in_thread(client.responses.create, model="tiny", input="x", tools=[WEATHER])
    assert [item.type for item in resp.output] == ["function_call", "message"]
    assert resp.output[1].content[0].text == "All done."


# -- what reaches the prompt ----------------------------------------------------------------


async def test_tool_outputs_reach_the_tokenized_prompt(client: openai.OpenAI, server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """function_call_output and custom_tool_call_output contents are in the ids the model reads."""
    s = script(monkeypatch, "Noted.")
    conversation = [
        {"role": "user", "content": "Weather in Paris, and count users?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "FOGGY-17C"},
        {"type": "custom_tool_call", "call_id": "call_2", "name": "run_sql", "input": "SELECT count(*) FROM users"},
        {"type": "custom_tool_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "ROWS-4242"}]},
        {"role": "user", "content": "Thanks!"},
    ]
    await in_thread(client.responses.create, model="tiny", input=conversation, tools=[WEATHER, SQL])
    prompt, _ = s.calls[0]
    tokenizer = server.runtime.tokenizer
    text = tokenizer.decode(encode_prompt(tokenizer, prompt))
    for needle in ("FOGGY-17C", "ROWS-4242", "SELECT count(*) FROM users", '{"city": "Paris"}', "Thanks!"):
        assert needle in text, needle
    # Each result sits after its call, in a tool response block.
    assert text.index("SELECT count(*)") < text.index("<tool_response>\nROWS-4242\n</tool_response>")
    assert text.index('"get_weather"') < text.index("<tool_response>\nFOGGY-17C\n</tool_response>")


# -- truncation --------------------------------------------------------------------------------


def long_conversation(turns: int) -> list[dict[str, Any]]:
    conversation: list[dict[str, Any]] = []
    for i in range(turns):
        conversation.append({"role": "user", "content": f"Question {i}: " + "the quick brown fox jumps over the lazy dog " * 3})
        conversation.append({"role": "assistant", "content": f"Answer {i}: " + "paged attention keeps keys in blocks " * 3})
    conversation.append({"role": "user", "content": "LAST QUESTION"})
    return conversation


async def test_truncation_auto_drops_the_oldest_items(server: Server) -> None:
    body = {"input": long_conversation(12), "instructions": "Be brief.", "max_output_tokens": 4, "temperature": 0}
    status, err = await post(server, body)
    assert status == 400 and err["error"]["code"] == "context_length_exceeded" and err["error"]["param"] == "input"
    status, resp = await post(server, {**body, "truncation": "auto"})
    assert status == 200, resp
    assert resp["truncation"] == "auto" and resp["status"] in ("completed", "incomplete")
    assert resp["usage"]["input_tokens"] + 4 <= server.runtime.max_model_len


async def test_truncation_auto_cannot_drop_the_last_item(server: Server) -> None:
    status, err = await post(server, {"input": "word " * 600, "truncation": "auto", "max_output_tokens": 4})
    assert status == 400 and err["error"]["code"] == "context_length_exceeded"


# -- echoed settings ---------------------------------------------------------------------------


async def test_reasoning_echo_keeps_every_setting(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    script(monkeypatch, "ok")
    reasoning = {"effort": "low", "generate_summary": "concise", "summary": "detailed"}
    status, body = await post(server, {"input": "x", "reasoning": reasoning})
    assert status == 200 and body["reasoning"] == reasoning
    assert strict_response(body).reasoning.generate_summary == "concise"
