"""Under a forcing tool_choice no text is emitted.

`tool_choice: "required"` (or a named tool) leaves the model no answer but calls. A call cut
by max_tokens used to come back as text: a second call cut before its name gave `content:
"<tool_"` beside the first call on Chat, and an extra `message` item on Responses, which a
framework taking the last message as the answer returned. A cut call is now dropped (cut
before its name) or reported as an incomplete call (cut after it), never as text: Chat and
Responses, streamed and not. Scripted text for the exact cuts, then real generation under the
grammar with max_tokens too small for one call.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from api.http.openai.tools.spec import format_call
from runtime.messages import FinishReason
from tests.support.clients import CHAT_FORECAST, CHAT_WEATHER, RESP_FORECAST, RESP_WEATHER, script
from tests.support.waiting import in_thread

PARIS = '{"city": "Paris"}'
FIRST = format_call("function", "get_weather", PARIS)
# A second call cut at each place that is not yet a call (its name not read).
CUTS = ["\n<", "\n<tool_", "\n<tool_call", '\n<tool_call>\n{"name": "fore', '\n<tool_call>\n{"name": "forecast", "argu']


async def chat_both(client: openai.OpenAI, **kwargs: Any) -> tuple[Any, list[Any]]:
    whole = await in_thread(client.chat.completions.create, model="tiny", messages=[{"role": "user", "content": "Weather?"}], **kwargs)
    chunks = await in_thread(lambda: list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Weather?"}], stream=True, **kwargs)))
    return whole, chunks


async def responses_both(client: openai.OpenAI, **kwargs: Any) -> tuple[Any, list[Any]]:
    whole = await in_thread(client.responses.create, model="tiny", input="Weather?", **kwargs)
    events = await in_thread(lambda: list(client.responses.create(model="tiny", input="Weather?", stream=True, **kwargs)))
    return whole, events


def streamed_text(chunks: list[Any]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


@pytest.mark.parametrize("cut", CUTS)
async def test_a_cut_second_call_is_not_text_on_chat(client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch, cut: str) -> None:
    script(monkeypatch, FIRST + cut, step=4, finish=FinishReason.LENGTH)
    whole, chunks = await chat_both(client, tools=[CHAT_WEATHER, CHAT_FORECAST], tool_choice="required")
    choice = whole.choices[0]
    assert choice.message.content is None and choice.finish_reason == "length"
    assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [("get_weather", PARIS)]
    assert streamed_text(chunks) == ""
    assert {tc.index for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []} == {0}


@pytest.mark.parametrize("cut", CUTS)
async def test_a_cut_second_call_is_not_text_on_responses(client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch, cut: str) -> None:
    script(monkeypatch, FIRST + cut, step=4, finish=FinishReason.LENGTH)
    whole, events = await responses_both(client, tools=[RESP_WEATHER, RESP_FORECAST], tool_choice="required")
    assert [o.type for o in whole.output] == ["function_call"] and whole.output[0].arguments == PARIS
    assert whole.status == "incomplete" and whole.output_text == ""
    assert not [e for e in events if e.type.startswith("response.output_text") or e.type.startswith("response.content_part")]
    assert [o.type for o in events[-1].response.output] == ["function_call"]


async def test_a_call_cut_after_its_name_is_an_incomplete_call(client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    script(monkeypatch, FIRST + '\n<tool_call>\n{"name": "forecast", "arguments": {"da', step=4, finish=FinishReason.LENGTH)
    whole, _ = await chat_both(client, tools=[CHAT_WEATHER, CHAT_FORECAST], tool_choice="required")
    assert whole.choices[0].message.content is None
    assert [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls] == [("get_weather", PARIS), ("forecast", '{"da')]
    resp, _ = await responses_both(client, tools=[RESP_WEATHER, RESP_FORECAST], tool_choice="required")
    assert [(o.type, o.status) for o in resp.output] == [("function_call", "completed"), ("function_call", "incomplete")]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "forecast"}}])
async def test_real_generation_cut_anywhere_makes_no_text_on_chat(client: openai.OpenAI, choice: Any) -> None:
    """Two tools: only `<tool_call>\\n{"name": "` is prefilled under `required`, so a short
    max_tokens cuts the call inside its name, where the parser cannot tell it is a call."""
    for max_tokens in (1, 2, 3, 5, 8):
        whole, chunks = await chat_both(client, tools=[CHAT_WEATHER, CHAT_FORECAST], tool_choice=choice, max_tokens=max_tokens, seed=max_tokens)
        assert whole.choices[0].message.content is None, (max_tokens, whole.choices[0].message.content)
        assert streamed_text(chunks) == "", max_tokens
        for call in whole.choices[0].message.tool_calls or []:  # complete, or cut and incomplete, never text
            assert call.function.name in ("get_weather", "forecast")


async def test_real_generation_cut_anywhere_makes_no_text_on_responses(client: openai.OpenAI) -> None:
    for max_tokens in (1, 2, 3, 5, 8):
        whole, events = await responses_both(client, tools=[RESP_WEATHER, RESP_FORECAST], tool_choice="required", max_output_tokens=max_tokens)
        assert whole.output_text == "" and all(o.type == "function_call" for o in whole.output), (max_tokens, whole.output)
        assert not [e for e in events if e.type == "response.output_text.delta"], max_tokens
        for item in whole.output:
            if item.status == "completed":
                assert json.loads(item.arguments)
