"""Thinking in each family's own format, through the `openai` SDK, on the family's real chat
template and tokens (tests/support/families.py), with a scripted model that thinks the way the
family does when its rendered prompt asks it to (tests/support/scripted_runner.py).

For every family: the reasoning parser is detected from the template; thinking is on or off by
default as the template has it, `reasoning_effort` turns it on (a family off by default) or off
(where the template has a switch), and `chat_template_kwargs` names the switch itself; the
thinking comes back as `reasoning`, the answer as `content` (without Granite's `<response>`
wrapper), whole and streamed, with its tokens counted as reasoning tokens; the Responses API
returns a reasoning item before the message; a tool call right after the thinking, in the
family's format, is a call. gpt-oss's harmony is in test_families.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import openai
import pytest
import trio

from tests.support.families import FAMILIES, family_tokenizer
from tests.support.scripted_runner import scripted_engine
from tests.support.servers import Server, start_runtime_server
from tests.support.waiting import in_thread

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
THOUGHT = "The user asks about Paris."
ANSWER = "It is sunny in Paris."


@dataclass(frozen=True)
class Thinker:
    family: str
    parser: str
    default_on: bool
    switch: str | None
    think: Callable[[str], str | None]  # the prompt → the thinking the model writes (None: it answers at once)


def _qwen3(prompt: str) -> str | None:
    return None if prompt.endswith("</think>\n\n") else f"<think>\n{THOUGHT}\n</think>\n\n"


THINKERS = {
    "qwen3": Thinker("qwen3", "qwen3", True, "enable_thinking", _qwen3),
    # On, the prompt ends inside `<think>`: the model writes only the rest; off, `<think></think>`.
    "deepseek-v3.1": Thinker("deepseek-v3.1", "deepseek_v3", False, "thinking", lambda p: f"{THOUGHT}</think>" if p.endswith("<think>") else None),
    # On, a system text asks for <think></think> then <response></response>.
    "granite-3.3": Thinker("granite-3.3", "granite", False, "thinking", lambda p: f"<think>{THOUGHT}</think><response>" if "Write your thoughts" in p else None),
    # Always thinks ([THINK] and [/THINK] are control tokens); no switch.
    "magistral": Thinker("magistral", "mistral", True, None, lambda p: f"[THINK]{THOUGHT}[/THINK]"),
}


def script(thinker: Thinker) -> Callable[[str], str]:
    def answer(prompt: str) -> str:
        thought = thinker.think(prompt)
        if "get_weather" in prompt:  # tools were rendered: think, then call in the family's own format
            return (thought or "").removesuffix("<response>") + FAMILIES[thinker.family].call
        if thought is None:
            return ANSWER
        return thought + ANSWER + ("</response>" if thought.endswith("<response>") else "")

    return answer


@pytest.fixture(params=sorted(THINKERS))
async def thinker_server(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Thinker, Server, openai.OpenAI]]:
    thinker = THINKERS[request.param]
    family = FAMILIES[thinker.family]
    tokenizer = await trio.to_thread.run_sync(family_tokenizer, family.name)
    engine = scripted_engine(tokenizer, script(thinker), [tokenizer.convert_tokens_to_ids(family.eos)])
    async with trio.open_nursery() as nursery:
        server = await start_runtime_server(nursery, engine)
        # the client's keep-alive connection would hold the server's stop up for hypercorn's graceful period
        with openai.OpenAI(base_url=server.openai_url, api_key="unused", max_retries=0, timeout=60) as client:
            yield thinker, server, client
        server.stop.set()


def chat(client: openai.OpenAI, **kwargs: Any) -> Any:
    return client.chat.completions.create(model="family", messages=ASK, max_tokens=100, **kwargs)


def streamed(client: openai.OpenAI, **kwargs: Any) -> tuple[str, str, Any]:
    chunks = list(client.chat.completions.create(model="family", messages=ASK, max_tokens=100, stream=True, stream_options={"include_usage": True}, **kwargs))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join(getattr(d, "reasoning", None) or "" for d in deltas)
    return reasoning, "".join(d.content or "" for d in deltas), chunks[-1].usage


def check(completion: Any, stream: tuple[str, str, Any], on: bool) -> None:
    message = completion.choices[0].message
    assert message.content == ANSWER and completion.choices[0].finish_reason == "stop", message
    assert message.model_extra.get("reasoning") == (THOUGHT if on else None), message
    thought_tokens = completion.usage.completion_tokens_details.reasoning_tokens
    assert (thought_tokens > 0) == on, completion.usage
    assert stream[:2] == (THOUGHT if on else "", ANSWER)
    assert stream[2].completion_tokens_details.reasoning_tokens == thought_tokens


async def test_a_family_thinks_in_its_own_format_when_asked(thinker_server: tuple[Thinker, Server, openai.OpenAI]) -> None:
    thinker, server, client = thinker_server
    card = (await in_thread(client.models.retrieve, "family")).model_extra["reasoning"]
    assert (card["parser"], card["default_on"], card["can_disable"]) == (thinker.parser, thinker.default_on, thinker.switch is not None)
    assert server.runtime.thinking.special == (thinker.parser == "mistral")  # type: ignore[attr-defined]  # its text keeps [THINK]
    cases: list[tuple[dict[str, Any], bool]] = [({}, thinker.default_on), ({"reasoning_effort": "high"}, True), ({"reasoning_effort": "none"}, thinker.switch is None)]
    if thinker.switch is not None:
        cases += [({"extra_body": {"chat_template_kwargs": {thinker.switch: not thinker.default_on}}}, not thinker.default_on)]
    for kwargs, on in cases:
        whole = await in_thread(chat, client, **kwargs)
        check(whole, await in_thread(streamed, client, **kwargs), on)
    response = await in_thread(lambda: client.responses.create(model="family", input=ASK[0]["content"], reasoning={"effort": "high"}, max_output_tokens=100))
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == THOUGHT
    assert response.output_text == ANSWER and response.usage.output_tokens_details.reasoning_tokens > 0


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


async def test_a_call_right_after_thinking_is_a_call(thinker_server: tuple[Thinker, Server, openai.OpenAI]) -> None:
    thinker, server, client = thinker_server
    on = {} if thinker.default_on else {"reasoning_effort": "high"}
    whole = await in_thread(chat, client, tools=[WEATHER], **on)

    def streamed_call() -> Any:
        with client.chat.completions.stream(model="family", messages=ASK, max_tokens=100, tools=[WEATHER], **on) as stream:
            return stream.get_final_completion()

    streamed_final = await in_thread(streamed_call)
    prompt = server.runtime.runner.prompts[-1]  # type: ignore[attr-defined]
    assert "get_weather" in prompt  # the tools reached the model, whether or not its template renders them
    # Granite's template asks for thinking only without tools: thought only where the prompt asked for it
    thought = THOUGHT if thinker.think(prompt) is not None else None
    for completion in (whole, streamed_final):
        choice = completion.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.model_extra.get("reasoning") == thought, choice
        (call,) = choice.message.tool_calls
        assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
