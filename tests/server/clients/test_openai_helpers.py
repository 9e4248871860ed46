"""The openai SDK's accumulating stream helpers against the live server.

`client.chat.completions.stream(...)` and `client.responses.stream(...)` build the final
completion or Response themselves, concatenating the streamed tool-call fragments (and, for
strict function tools, parsing them as JSON), so they see what every streaming client sees.
A call's head and its first arguments arrive in one generated delta here (`step` large), as
they do whenever a tokenizer or the detokenizer joins them: streamed Chat once sent that
first fragment twice, `{"city": "Paris"}` arriving as `{"city": "Paris"}{"city": "Paris"}`.

The model's text is scripted (tests/clients/conftest.py `script`): exact calls, function and
custom tools, several in one turn, n = 2.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from api.http.openai.tools.spec import format_call
from tests.support.clients import CHAT_FORECAST, CHAT_SHOUT, CHAT_WEATHER, RESP_SHOUT, RESP_WEATHER, script
from tests.support.waiting import in_thread

PARIS = '{"city": "Paris"}'
TWO_CALLS = format_call("function", "get_weather", PARIS) + "\n" + format_call("custom", "shout", "THEINPUT!")
STRICT_WEATHER = {"type": "function", "function": {**CHAT_WEATHER["function"], "strict": True}}
MESSAGES = [{"role": "user", "content": "Weather in Paris, and shout."}]


def chat_stream(client: openai.OpenAI, **kwargs: Any) -> tuple[list[Any], Any]:
    with client.chat.completions.stream(model="tiny", messages=MESSAGES, **kwargs) as stream:
        events = list(stream)
        return events, stream.get_final_completion()


@pytest.mark.parametrize("step", [1000, 25, 1])
async def test_chat_stream_helper_parses_a_strict_call_once(client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    script(monkeypatch, format_call("function", "get_weather", PARIS), step=step)
    events, final = await in_thread(chat_stream, client, tools=[STRICT_WEATHER])
    [call] = final.choices[0].message.tool_calls
    assert call.function.arguments == PARIS and call.function.parsed_arguments == {"city": "Paris"}
    assert final.choices[0].finish_reason == "tool_calls" and not final.choices[0].message.content
    done = [e for e in events if e.type == "tool_calls.function.arguments.done"]
    assert [(e.name, e.arguments, e.parsed_arguments) for e in done] == [("get_weather", PARIS, {"city": "Paris"})]
    deltas = [e.arguments_delta for e in events if e.type == "tool_calls.function.arguments.delta"]
    assert "".join(deltas) == PARIS


async def test_chat_stream_helper_with_parallel_calls_and_n_2(client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    script(monkeypatch, format_call("function", "get_weather", PARIS) + "\n" + format_call("function", "forecast", '{"days": 3}'), step=1000)
    _, final = await in_thread(chat_stream, client, tools=[STRICT_WEATHER, CHAT_FORECAST], n=2, temperature=1)
    assert len(final.choices) == 2
    for choice in final.choices:
        weather, forecast = choice.message.tool_calls
        assert (weather.index, weather.function.name, weather.function.parsed_arguments) == (0, "get_weather", {"city": "Paris"})
        assert (forecast.index, forecast.function.name, forecast.function.arguments) == (1, "forecast", '{"days": 3}')
        assert weather.id != forecast.id and choice.finish_reason == "tool_calls"


async def test_chat_stream_helper_and_custom_tool_calls(client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK's Chat stream helper knows no custom tool calls (openai 3.57): it keeps the
    unknown `custom` member of the snapshot as a plain dict, and `get_final_completion()` then
    fails reading `tool_call.custom.name` (AttributeError), where the non-streamed `parse()`
    only drops the call with a warning. The client's bug, pinned here; the workaround, for a
    client that streams custom tools on Chat, is the accumulated snapshot (or the Responses
    API, whose helper handles them, below)."""
    script(monkeypatch, TWO_CALLS, step=1000)

    def run() -> Any:
        with client.chat.completions.stream(model="tiny", messages=MESSAGES, tools=[CHAT_WEATHER, CHAT_SHOUT], n=2, temperature=1) as stream:
            for _ in stream:
                pass
            with pytest.raises(AttributeError, match="name"):
                stream.get_final_completion()
            return stream.current_completion_snapshot

    snapshot = await in_thread(run)
    for choice in snapshot.choices:
        weather, shout = choice.message.tool_calls
        assert weather.type == "function" and weather.function.arguments == PARIS
        assert shout.type == "custom" and shout.to_dict()["custom"] == {"name": "shout", "input": "THEINPUT!"}


async def test_raw_chat_deltas_are_shaped_like_openais(client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    """The head delta: index, id, type, name and empty arguments; then index and fragments."""
    script(monkeypatch, TWO_CALLS, step=1000)

    def raw() -> list[dict[str, Any]]:
        stream = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=[CHAT_WEATHER, CHAT_SHOUT], stream=True)
        return [tc.to_dict() for chunk in stream for choice in chunk.choices for tc in choice.delta.tool_calls or []]

    entries = await in_thread(raw)
    heads = [e for e in entries if "id" in e]
    assert [{k: v for k, v in h.items() if k != "id"} for h in heads] == [
        {"index": 0, "type": "function", "function": {"name": "get_weather", "arguments": ""}},
        {"index": 1, "type": "custom", "custom": {"name": "shout", "input": ""}},
    ]
    rest = [e for e in entries if "id" not in e]
    assert all(set(e) == {"index", "function"} and set(e["function"]) == {"arguments"} for e in rest if e["index"] == 0)
    assert all(set(e) == {"index", "custom"} and set(e["custom"]) == {"input"} for e in rest if e["index"] == 1)
    assert "".join(e["function"]["arguments"] for e in rest if e["index"] == 0) == PARIS
    assert "".join(e["custom"]["input"] for e in rest if e["index"] == 1) == "THEINPUT!"


async def test_responses_stream_helper_with_parallel_function_and_custom_calls(client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    script(monkeypatch, "Checking.\n" + TWO_CALLS, step=1000)

    def run() -> tuple[list[Any], Any]:
        with client.responses.stream(model="tiny", input="Weather in Paris, and shout.", tools=[RESP_WEATHER, RESP_SHOUT]) as stream:
            events = list(stream)
            return events, stream.get_final_response()

    events, final = await in_thread(run)
    message, weather, shout = final.output
    assert message.type == "message" and final.output_text == "Checking."
    assert weather.type == "function_call" and weather.arguments == PARIS and json.loads(weather.arguments) == {"city": "Paris"}
    assert shout.type == "custom_tool_call" and shout.input == "THEINPUT!"
    done = {e.type: e for e in events if e.type.endswith(".done") and "call" in e.type}
    assert done["response.function_call_arguments.done"].arguments == PARIS
    assert done["response.custom_tool_call_input.done"].input == "THEINPUT!"
    assert final.usage is not None and final.usage.output_tokens > 0  # item 4: always there
