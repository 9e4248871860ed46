"""The default model's forced tool calls stay within the schema's keys: with a
city/unit schema that does not set additionalProperties, "Weather in Oslo in fahrenheit"
made SmolLM2 write `{"city": "Oslo", "type": "string", "properties": ...` under tool_choice
named or required until max_tokens cut it; now the call ends, with declared keys only."""

from __future__ import annotations

import json

import openai
import pytest

from tests.support.servers import Server
from tests.support.waiting import in_thread

pytestmark = pytest.mark.slow

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city.", "parameters": SCHEMA}}


async def test_forced_calls_end_with_declared_keys(default_server: Server) -> None:
    model = default_server.runtime.served_name  # type: ignore[attr-defined]
    with openai.OpenAI(base_url=default_server.openai_url, api_key="unused", max_retries=0, timeout=300) as client:
        for choice in ({"type": "function", "function": {"name": "get_weather"}}, "required"):
            out = await in_thread(
                client.chat.completions.create, model=model, messages=[{"role": "user", "content": "Weather in Oslo in fahrenheit please"}],
                tools=[TOOL], tool_choice=choice, parallel_tool_calls=False, temperature=0, max_tokens=48,
            )
            choice_out = out.choices[0]
            assert choice_out.finish_reason == "tool_calls", choice_out
            [call] = choice_out.message.tool_calls
            arguments = json.loads(call.function.arguments)
            assert call.function.name == "get_weather" and "city" in arguments and set(arguments) <= {"city", "unit"}, arguments
