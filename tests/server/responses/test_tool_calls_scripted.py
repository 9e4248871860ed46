"""Tool calls end to end through the routes and the openai SDK, with scripted model output.

The tiny random model never writes a tool call, and until guided decoding lands nothing forces
it to, so these tests swap the route's `Generation` for a script (tests/support/scripted.py):
the text a model would write under the grammar. Each test also checks that the guide the route
built accepts that very text, so the grammar, the parser and the events agree.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

import api.http.openai.chat.view
import api.http.openai.responses.view
from api.http.openai.tools.spec import format_call
from runtime.messages import FinishReason
from tests.support.scripted import Script, guide_accepts
from tests.support.servers import Server
from tests.support.waiting import in_thread

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False},
}
PATCH_GRAMMAR = r"""start: "*** Begin Patch" LF hunk+ "*** End Patch"
hunk: "*** Add File: " PATH LF line+
line: "+" /[^\n]*/ LF
PATH: /[A-Za-z0-9_.\/-]+/
LF: "\n"
"""
PATCH_TOOL = {"type": "custom", "name": "apply_patch", "description": "Apply a patch.", "format": {"type": "grammar", "syntax": "lark", "definition": PATCH_GRAMMAR}}
PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+hello world\n*** End Patch"


def script(monkeypatch: pytest.MonkeyPatch, text: str, step: int = 3, finish: FinishReason = FinishReason.STOP) -> Script:
    s = Script([text[i : i + step] for i in range(0, len(text), step)], finish)
    monkeypatch.setattr(api.http.openai.responses.view, "Generation", s)
    monkeypatch.setattr(api.http.openai.chat.view, "Generation", s)
    return s


async def test_forced_function_call(client: openai.OpenAI, server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    s = script(monkeypatch, format_call("function", "get_weather", '{"city": "Paris"}'))
    resp = await in_thread(
        client.responses.create, model="tiny", input="Weather in Paris?", tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"}
    )
    [call] = resp.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    assert json.loads(call.arguments) == {"city": "Paris"} and call.call_id.startswith("call_")
    assert resp.status == "completed" and resp.tool_choice.name == "get_weather"
    prompt, sampling = s.calls[0]
    assert sampling.guide.kind == "lark" and guide_accepts(server.runtime.tokenizer, sampling.guide, s.text)
    assert "get_weather" in prompt.messages[0]["content"]  # the tiny template takes no tools: a system block


async def test_streamed_function_call_events(client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    script(monkeypatch, "Let me check.\n" + format_call("function", "get_weather", '{"city": "Paris"}'), step=2)

    def run() -> tuple[list[Any], Any]:
        with client.responses.stream(model="tiny", input="Weather?", tools=[WEATHER]) as stream:
            events = list(stream)
            return events, stream.get_final_response()

    events, final = await in_thread(run)
    types = [e.type for e in events]
    assert types[0:2] == ["response.created", "response.in_progress"]
    assert "response.function_call_arguments.delta" in types and types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    message, call = final.output
    assert message.type == "message" and message.content[0].text == "Let me check."
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(args) == {"city": "Paris"} == json.loads(call.arguments)
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.arguments == call.arguments and done.item_id == call.id


async def test_custom_tool_with_grammar(client: openai.OpenAI, server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    s = script(monkeypatch, format_call("custom", "apply_patch", PATCH), step=5)

    def stream() -> list[Any]:
        return list(client.responses.create(model="tiny", input="Add hello.txt", tools=[PATCH_TOOL], tool_choice={"type": "custom", "name": "apply_patch"}, stream=True))

    events = await in_thread(stream)
    final = events[-1].response
    [call] = final.output
    assert call.type == "custom_tool_call" and call.name == "apply_patch" and call.input == PATCH
    assert "".join(e.delta for e in events if e.type == "response.custom_tool_call_input.delta") == PATCH
    assert next(e for e in events if e.type == "response.custom_tool_call_input.done").input == PATCH
    _, sampling = s.calls[0]
    assert guide_accepts(server.runtime.tokenizer, sampling.guide, s.text)
    assert not guide_accepts(server.runtime.tokenizer, sampling.guide, format_call("custom", "apply_patch", "*** Begin Patch\nrm -rf /\n"))


async def test_parallel_calls_and_multi_turn(client: openai.OpenAI, server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    text = format_call("function", "get_weather", '{"city": "Paris"}') + "\n" + format_call("function", "get_weather", '{"city": "Rome"}')
    s = script(monkeypatch, text)
    resp = await in_thread(client.responses.create, model="tiny", input="Paris and Rome?", tools=[WEATHER], tool_choice="required")
    assert [json.loads(c.arguments)["city"] for c in resp.output] == ["Paris", "Rome"]
    assert guide_accepts(server.runtime.tokenizer, s.calls[0][1].guide, text)
    # Next turn: the calls and their outputs go back in; the model answers in text.
    s2 = script(monkeypatch, "Sunny in both.")
    follow = [{"role": "user", "content": "Paris and Rome?"}]
    follow += [c.model_dump(exclude_none=True) for c in resp.output]
    follow += [{"type": "function_call_output", "call_id": c.call_id, "output": '{"sky": "sunny"}'} for c in resp.output]
    resp2 = await in_thread(client.responses.create, model="tiny", input=follow, tools=[WEATHER])
    assert resp2.output_text == "Sunny in both."
    prompt, _ = s2.calls[0]
    [results] = [m["content"] for m in prompt.messages if m["content"].startswith("<tool_response>")]
    assert results.count("sunny") == 2
    assert "Rome" in json.dumps(prompt.messages)


async def test_not_parallel_means_one_call(client: openai.OpenAI, server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    one = format_call("function", "get_weather", '{"city": "Paris"}')
    s = script(monkeypatch, one)
    await in_thread(client.responses.create, model="tiny", input="x", tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    guide = s.calls[0][1].guide
    assert guide_accepts(server.runtime.tokenizer, guide, one)
    assert not guide_accepts(server.runtime.tokenizer, guide, one + "\n" + one)


async def test_call_cut_by_max_tokens_is_incomplete(client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    script(monkeypatch, '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Pa', finish=FinishReason.LENGTH)
    resp = await in_thread(client.responses.create, model="tiny", input="x", tools=[WEATHER], max_output_tokens=5)
    assert resp.status == "incomplete" and resp.output[0].status == "incomplete"


async def test_json_schema_output(client: openai.OpenAI, server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"], "additionalProperties": False}
    s = script(monkeypatch, '{"answer": 4}')
    resp = await in_thread(
        client.responses.create, model="tiny", input="2+2?", text={"format": {"type": "json_schema", "name": "sum", "schema": schema, "strict": True}}
    )
    assert json.loads(resp.output_text) == {"answer": 4}
    assert resp.text.format.type == "json_schema" and resp.text.format.name == "sum"
    guide = s.calls[0][1].guide
    assert guide.kind == "json_schema" and json.loads(guide.definition) == schema and guide.param == "text.format"
    assert guide_accepts(server.runtime.tokenizer, guide, s.text) and not guide_accepts(server.runtime.tokenizer, guide, '{"answer": "4"}')
    script(monkeypatch, "{}")
    await in_thread(client.responses.create, model="tiny", input="json", text={"format": {"type": "json_object"}})


# -- Chat ------------------------------------------------------------------------------------

CHAT_WEATHER = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}


async def test_chat_tool_call(client: openai.OpenAI, server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    s = script(monkeypatch, format_call("function", "get_weather", '{"city": "Paris"}'))
    resp = await in_thread(
        client.chat.completions.create,
        model="tiny",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[CHAT_WEATHER],
        tool_choice="required",
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert guide_accepts(server.runtime.tokenizer, s.calls[0][1].guide, s.text)
    # The result goes back as a tool message; the next answer is text.
    s2 = script(monkeypatch, "It is sunny.")
    resp2 = await in_thread(
        client.chat.completions.create,
        model="tiny",
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            choice.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "sunny"}'},
        ],
        tools=[CHAT_WEATHER],
    )
    assert resp2.choices[0].message.content == "It is sunny." and resp2.choices[0].finish_reason == "stop"
    rendered = json.dumps(s2.calls[0][0].messages)
    assert "<tool_response>" in rendered and "get_weather" in rendered


async def test_chat_tool_call_streaming(client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    script(monkeypatch, "Checking.\n" + format_call("function", "get_weather", '{"city": "Paris"}'), step=2)

    def stream() -> list[Any]:
        return list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], tools=[CHAT_WEATHER], stream=True))

    chunks = await in_thread(stream)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == "Checking."
    calls = [tc for d in deltas for tc in d.tool_calls or []]
    assert calls[0].id and calls[0].function.name == "get_weather"
    assert json.loads("".join(tc.function.arguments or "" for tc in calls)) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


async def test_chat_response_format_json_schema(client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    s = script(monkeypatch, '{"a": 1}')
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    await in_thread(
        client.chat.completions.create,
        model="tiny",
        messages=[{"role": "user", "content": "x"}],
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    )
    guide = s.calls[0][1].guide
    assert guide.kind == "json_schema" and json.loads(guide.definition) == schema and guide.param == "response_format"
    await in_thread(client.chat.completions.create, model="tiny", messages=[{"role": "user", "content": "x"}], response_format={"type": "json_object"})
    assert s.calls[1][1].guide.kind == "json_object"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}]}, "tools[0].function.parameters"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}}, "response_format.json_schema.schema"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema.schema"),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        (
            {"tools": [{"type": "custom", "custom": {"name": "g", "format": {"type": "grammar", "grammar": {"syntax": "lark", "definition": "start: ("}}}}]},
            "tools[0].custom.format.definition",
        ),
    ],
)
async def test_chat_bad_tools_get_400(client: openai.OpenAI, body: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await in_thread(client.chat.completions.create, model="tiny", messages=[{"role": "user", "content": "x"}], **body)
    assert info.value.body["param"] == param, info.value.body
