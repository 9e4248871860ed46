"""Guided requests with n-gram drafts on the default configuration (slow: real weights).

Each guided body replays 20 times against one server whose every step drafts (so from the
second answer on the n-gram pool holds the answer itself, and drafts run past the grammar's
end: the newline and end of text the model wrote after it). Each must answer 200, the same
text every time, and a completed grammar ends the request as without drafts (a JSON schema
and the second turn of a forced tool call parse; JSON mode runs to the token limit). Before the fix, 6 to 20 of 20 such requests failed with a 500 carrying llguidance's
state (tests/engine/test_spec_grammar.py shows the cause on the tiny model).
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.support.device import needs_kernels
from tests.support.servers import Server
from tests.support.spec import DraftSwitch
from tests.support.waiting import in_thread

pytestmark = [pytest.mark.slow, needs_kernels()]

REPLAYS = 20
MODEL = "smollm2-135m-instruct"
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "population": {"type": "integer", "minimum": 0, "maximum": 99999999}}, "required": ["city", "population"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}}}
TURN = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21, "sky": "clear"}'},
]
BODIES: dict[str, dict[str, Any]] = {
    "json_schema": dict(messages=[{"role": "user", "content": "The largest city of France and its population, as JSON."}], response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}),
    "json_object": dict(messages=[{"role": "user", "content": "Describe Paris as a JSON object."}], response_format={"type": "json_object"}, max_tokens=24),
    "forced_call_second_turn": dict(messages=TURN, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}),
}


def replay(client: openai.OpenAI, body: dict[str, Any]) -> list[tuple[str, str]]:
    """The body sent REPLAYS times, greedy: each answer's content (or its call's arguments) and
    finish reason."""
    out = []
    for _ in range(REPLAYS):
        choice = client.chat.completions.create(**{"model": MODEL, "max_tokens": 64, "temperature": 0, **body}).choices[0]
        message = choice.message
        out.append((message.tool_calls[0].function.arguments if message.tool_calls else message.content, choice.finish_reason))
    return out


async def test_guided_bodies_replayed_with_drafts_answer_the_same_every_time(served_default: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    DraftSwitch(monkeypatch, on=True)
    client = openai.OpenAI(base_url=served_default.openai_url, api_key="unused", max_retries=0)
    for name, body in BODIES.items():
        answers = await in_thread(replay, client, body)  # any 5xx raises here
        assert len(set(answers)) == 1, (name, set(answers))
        text, finish = answers[0]
        if name == "json_object":  # the small model goes on writing keys until the token limit
            assert text.startswith("{") and finish == "length", answers[0]
            continue
        assert finish in ("stop", "tool_calls"), answers[0]  # the grammar completed, and ended the request
        parsed = json.loads(text)
        assert isinstance(parsed, dict) and (name != "json_schema" or set(parsed) == {"city", "population"}), text
    stats: Any = served_default.runtime.statistics()  # type: ignore[attr-defined]
    assert stats["spec_accepted_tokens"] > 0, stats
