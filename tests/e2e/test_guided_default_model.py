"""Constrained tool calls and structured outputs on the real default model (SmolLM2-135M).

A 135M model left to itself writes neither valid tool calls nor schema-valid JSON, so these
pass only when the engine enforces `SamplingParams.guide` token by token: forced function
arguments validate against the function's JSON schema (`jsonschema`), a custom tool's input
parses with its Lark grammar (the `lark` package), and json_schema outputs validate.
Slow: real weights on CPU.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import lark
import openai
import pytest

from tests.support.servers import Server
from tests.support.waiting import in_thread

pytestmark = pytest.mark.slow

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city.", "parameters": WEATHER_SCHEMA}
# A small patch format: one file, one to three added lines, bounded so generation ends.
PATCH_GRAMMAR = r"""start: "*** Begin Patch" LF "*** Add File: " PATH LF line~1..3 "*** End Patch"
line: "+" TEXT LF
PATH: /[a-z]{1,8}\.txt/
TEXT: /[a-z ]{1,24}/
LF: "\n"
"""
PATCH_TOOL = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Create a file with a patch.",
    "format": {"type": "grammar", "syntax": "lark", "definition": PATCH_GRAMMAR},
}
PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


class Client:
    """The openai client with this server's model name filled in."""

    def __init__(self, client: openai.OpenAI, model: str) -> None:
        self.client, self.model = client, model

    async def responses(self, **kwargs: Any) -> Any:
        return await in_thread(self.client.responses.create, model=self.model, **kwargs)

    async def chat(self, **kwargs: Any) -> Any:
        return await in_thread(self.client.chat.completions.create, model=self.model, **kwargs)

    async def responses_events(self, **kwargs: Any) -> list[Any]:
        return await in_thread(lambda: list(self.client.responses.create(model=self.model, stream=True, **kwargs)))


@pytest.fixture
def client(default_server: Server) -> Iterator[Client]:
    with openai.OpenAI(base_url=default_server.openai_url, api_key="unused", max_retries=0, timeout=300) as c:
        yield Client(c, default_server.runtime.served_name)  # type: ignore[attr-defined]


async def test_forced_function_call_matches_schema(client: Client) -> None:
    resp = await client.responses(
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        temperature=0,
        max_output_tokens=96,
    )
    assert resp.status == "completed", resp
    [call] = resp.output
    assert call.type == "function_call" and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER_SCHEMA)


async def test_required_tool_call_streamed_and_sampled(client: Client) -> None:
    events = await client.responses_events(
        input="Weather in Rome and in Oslo?",
        tools=[WEATHER],
        tool_choice="required",
        temperature=0.8,
        max_tool_calls=2,  # two calls of at most ~50 tokens each: the grammar ends well inside 160
        max_output_tokens=160,
    )
    final = events[-1].response
    assert final.status == "completed", final
    calls = [item for item in final.output if item.type == "function_call"]
    assert 1 <= len(calls) <= 2 and all(item.type == "function_call" for item in final.output)
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), WEATHER_SCHEMA)
    streamed = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert streamed == "".join(c.arguments for c in calls)


async def test_custom_tool_input_parses_with_its_grammar(client: Client) -> None:
    resp = await client.responses(
        input="Create hello.txt containing the line 'hello world'.",
        tools=[PATCH_TOOL],
        tool_choice={"type": "custom", "name": "apply_patch"},
        temperature=0,
        max_output_tokens=128,
    )
    assert resp.status == "completed", resp
    [call] = resp.output
    assert call.type == "custom_tool_call" and call.name == "apply_patch"
    lark.Lark(PATCH_GRAMMAR).parse(call.input)


async def test_json_schema_output_validates(client: Client) -> None:
    resp = await client.responses(
        input="Invent a person: a name and an age.",
        text={"format": {"type": "json_schema", "name": "person", "schema": PERSON_SCHEMA, "strict": True}},
        temperature=0,
        max_output_tokens=64,
    )
    assert resp.status == "completed", resp
    jsonschema.validate(json.loads(resp.output_text), PERSON_SCHEMA)


async def test_chat_tools_and_response_format(client: Client) -> None:
    chat_tool = {"type": "function", "function": {"name": "get_weather", "description": "Current weather.", "parameters": WEATHER_SCHEMA}}
    resp = await client.chat(
        messages=[{"role": "user", "content": "Weather in Lima?"}],
        tools=[chat_tool],
        tool_choice="required",
        temperature=0,
        max_tokens=96,
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    for call in choice.message.tool_calls:
        jsonschema.validate(json.loads(call.function.arguments), WEATHER_SCHEMA)
    resp = await client.chat(
        messages=[{"role": "user", "content": "Invent a person."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA}},
        temperature=0,
        max_tokens=64,
    )
    assert resp.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(resp.choices[0].message.content), PERSON_SCHEMA)
    resp = await client.chat(
        messages=[{"role": "user", "content": "Reply in JSON."}],
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=64,
    )
    # json_object bounds nothing, so a small model may run out of tokens inside a string: what
    # it wrote is then the start of an object, and a finished answer is a whole one.
    content = resp.choices[0].message.content
    assert content.startswith("{")
    if resp.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)


async def test_multi_turn_with_tool_outputs_through_the_sdk(client: Client) -> None:
    """The agent loop on the real model: a forced call, its output sent back with the call item
    the SDK returned, then an answer in text; the same for a custom tool. The outputs must be in
    the second prompt (it grows by at least their tokens)."""
    user = {"role": "user", "content": "What is the weather in Paris? Then create hello.txt."}
    first = await client.responses(
        input=[user], tools=[WEATHER, PATCH_TOOL], tool_choice={"type": "function", "name": "get_weather"}, temperature=0, max_output_tokens=96
    )
    [call] = first.output
    assert call.type == "function_call"
    weather = '{"temperature_c": 21, "sky": "clear", "report": "a mild, clear afternoon in Paris"}'
    turn2 = [user, call.model_dump(exclude_none=True), {"type": "function_call_output", "call_id": call.call_id, "output": weather}]
    second = await client.responses(
        input=turn2, tools=[WEATHER, PATCH_TOOL], tool_choice={"type": "custom", "name": "apply_patch"}, temperature=0, max_output_tokens=128
    )
    [patch] = second.output
    assert patch.type == "custom_tool_call" and patch.call_id != call.call_id
    lark.Lark(PATCH_GRAMMAR).parse(patch.input)
    assert second.usage.input_tokens > first.usage.input_tokens + 20  # the call and its output are in

    result = "Created hello.txt (1 line)."
    turn3 = [*turn2, patch.model_dump(exclude_none=True), {"type": "custom_tool_call_output", "call_id": patch.call_id, "output": result}]
    third = await client.responses(input=turn3, tools=[WEATHER, PATCH_TOOL], tool_choice="none", temperature=0, max_output_tokens=32)
    assert third.status in ("completed", "incomplete")
    assert [item.type for item in third.output] == ["message"] and third.output_text
    # The same turn without the custom tool's call and output (tool_choice none drops the tools
    # block, so compare like with like): the call and its output are in the prompt.
    without = await client.responses(input=turn2, tools=[WEATHER, PATCH_TOOL], tool_choice="none", temperature=0, max_output_tokens=1)
    assert third.usage.input_tokens > without.usage.input_tokens + 10
