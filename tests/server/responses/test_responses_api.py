"""POST /v1/responses through the official openai SDK, on the tiny random model.

The SDK parses every body and every streamed event into its own types (and its
`responses.stream()` helper checks that the events add up), so it judges our shapes.
"""

from __future__ import annotations

import base64
from typing import Any

import httpx
import openai
import pytest

from tests.support.servers import Server
from tests.support.waiting import in_thread


async def test_create_non_streaming(client: openai.OpenAI) -> None:
    resp = await in_thread(
        client.responses.create,
        model="tiny",
        input="hello there",
        instructions="Be brief.",
        max_output_tokens=8,
        temperature=0,
        metadata={"k": "v"},
        prompt_cache_key="user-1",
        safety_identifier="sid",
        top_logprobs=3,
    )
    assert resp.object == "response" and resp.id.startswith("resp_")
    assert resp.model == "tiny"
    assert resp.status in ("completed", "incomplete")
    if resp.status == "incomplete":
        assert resp.incomplete_details.reason == "max_output_tokens"
    [item] = resp.output
    assert item.type == "message" and item.role == "assistant"
    assert item.content[0].type == "output_text"
    assert resp.output_text == item.content[0].text
    assert resp.usage.output_tokens <= 8 and resp.usage.input_tokens > 3
    assert resp.usage.output_tokens_details.reasoning_tokens == 0
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens
    # The request's settings come back.
    assert resp.instructions == "Be brief." and resp.max_output_tokens == 8 and resp.temperature == 0
    assert resp.metadata == {"k": "v"} and resp.prompt_cache_key == "user-1" and resp.safety_identifier == "sid"
    assert resp.top_logprobs == 3 and resp.tools == [] and resp.tool_choice == "auto" and resp.parallel_tool_calls is True
    assert resp.store is False


async def test_length_limit_is_incomplete(client: openai.OpenAI) -> None:
    # Greedy: sampled, the random model's third token was once its EOS (3 output tokens,
    # "completed", rightly), which the skip below did not catch.
    resp = await in_thread(client.responses.create, model="tiny", input="count", max_output_tokens=3, temperature=0)
    if resp.usage.output_tokens < 3:
        pytest.skip("the random model stopped early")
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert resp.output[0].status == "incomplete"


async def test_streaming_events_match_non_streaming(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = dict(model="tiny", input=[{"role": "user", "content": "stream me"}], max_output_tokens=12, temperature=0)
    whole = await in_thread(client.responses.create, **kwargs)

    def stream() -> list[Any]:
        return list(client.responses.create(stream=True, stream_options={"include_usage": True}, **kwargs))

    events = await in_thread(stream)
    types = [e.type for e in events]
    assert types[:4] == ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done", f"response.{whole.status}"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    final = events[-1].response
    assert final.output_text == whole.output_text and final.usage.output_tokens == whole.usage.output_tokens
    assert events[0].response.id == final.id and events[0].response.status == "in_progress"


async def test_multi_turn_with_tool_outputs(client: openai.OpenAI) -> None:
    tools = [
        {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
        {"type": "custom", "name": "run_sql", "description": "Run SQL."},
    ]
    conversation = [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris, and count users?"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": '{"temp": 21}'},
        {"type": "custom_tool_call", "call_id": "call_2", "name": "run_sql", "input": "SELECT count(*) FROM users"},
        {"type": "custom_tool_call_output", "call_id": "call_2", "output": "42"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "It is 21C; 42 users."}]},
        {"role": "user", "content": "Thanks!"},
    ]
    resp = await in_thread(
        client.responses.create,
        model="tiny",
        input=conversation,
        tools=tools,
        tool_choice="none",
        max_output_tokens=4,
        reasoning={"effort": "low", "encrypted_content": "abc=="},
    )
    assert resp.status in ("completed", "incomplete")
    assert [t.type for t in resp.tools] == ["function", "custom"]
    assert resp.tool_choice == "none"
    assert resp.reasoning.effort == "low"
    assert resp.reasoning.model_extra.get("encrypted_content") == "abc=="  # opaque, echoed untouched


async def test_text_file_input_is_read(client: openai.OpenAI) -> None:
    data = base64.b64encode(b"a small text file").decode()
    resp = await in_thread(
        client.responses.create,
        model="tiny",
        input=[{"role": "user", "content": [
            {"type": "input_text", "text": "Summarise:"},
            {"type": "input_file", "filename": "notes.txt", "file_data": f"data:text/plain;base64,{data}"},
        ]}],
        max_output_tokens=2,
    )
    assert resp.usage.input_tokens > 10


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"background": True}, "background"),
        ({"store": True}, "store"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"service_tier": "flex"}, "service_tier"),
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"temperature": 3}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"include": ["message.output_text.logprobs", "output_text.everything"]}, "include[1]"),
        ({"prompt": {"id": "pmpt_1", "variables": {"x": "y"}}}, "prompt.id"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]}, "input[0].content[0]"),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file_1"}]}]}, "input[0].content[0].file_id"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64,AAAA"}]}]},
            "input[0].content[0].file_data",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        ({"input": [{"role": "wizard", "content": "x"}]}, "input[0].role"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "objectx"}}}}, "text.format.schema"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "name": "bad name!"}]}, "tools[0].name"),
        ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "nope"}}]}, "tools[0].parameters"),
        ({"tools": [{"type": "function", "name": "f", "parameters": {"type": "string"}}]}, "tools[0].parameters"),
        ({"tools": [{"type": "function", "name": "f", "parameters": {"type": ["object", "null"]}}]}, "tools[0].parameters"),
        (
            {"tools": [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(16)}}}]},
            "tools[0].parameters.properties",
        ),
        ({"tools": [{"type": "function", "name": f"f{i}"} for i in range(33)]}, "tools"),
        ({"tools": [{"type": "custom", "name": "g", "format": {"type": "grammar", "syntax": "lark", "definition": "start: undefined_rule"}}]}, "tools[0].format.definition"),
        ({"tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": "g"}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
    ],
)
async def test_bad_requests_get_400_naming_the_field(client: openai.OpenAI, body: dict[str, Any], param: str) -> None:
    payload: dict[str, Any] = {"model": "tiny", "input": "hi", "max_output_tokens": 2, **body}
    with pytest.raises(openai.BadRequestError) as info:
        await in_thread(client.responses.create, **payload)
    err = info.value.body
    assert isinstance(err, dict) and err["param"] == param, err
    assert err["type"] == "invalid_request_error"


async def test_bad_grammar_error_names_the_tool(client: openai.OpenAI) -> None:
    tools = [{"type": "custom", "name": "apply_patch", "format": {"type": "grammar", "syntax": "lark", "definition": "start: ("}}]
    with pytest.raises(openai.BadRequestError) as info:
        await in_thread(client.responses.create, model="tiny", input="hi", tools=tools)
    assert "apply_patch" in info.value.body["message"] and info.value.body["code"] == "invalid_grammar"


async def test_raw_sse_framing(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        async with http.stream("POST", "/v1/responses", json={"model": "tiny", "input": "x", "max_output_tokens": 3, "stream": True}) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            body = (await r.aread()).decode()
    blocks = [b for b in body.split("\n\n") if b]
    for block in blocks:
        name, data = block.split("\n", 1)
        assert name.startswith("event: ") and data.startswith("data: ")
        assert f'"type":"{name[7:]}"' in data
    assert "[DONE]" not in body


async def test_context_overflow_names_max_output_tokens(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        resp = await http.post("/v1/responses", json={"model": "tiny", "input": "hello", "max_output_tokens": 100000})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == "max_output_tokens" and "max_output_tokens" in error["message"]
