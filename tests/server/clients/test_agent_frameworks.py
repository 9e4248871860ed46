"""Agent frameworks run their tool loop against the live server, streaming.

The OpenAI Agents SDK (`openai-agents`) and Pydantic AI (`pydantic-ai-slim[openai]`), each on
its Chat Completions model and its Responses model, streamed: the model calls a tool, the
framework runs it with the arguments it accumulated from the stream, sends the result back,
and the model answers. With Chat's first arguments fragment sent twice, the Agents SDK
answered "An error occurred while running the tool" without running it, and Pydantic AI read
the arguments as {}. The model's turns are scripted (the call's head and its arguments in one
delta), then one run generates its call for real under a forcing tool_choice.

Clients are asyncio: each run gets its own event loop in a worker thread (`in_asyncio`).
Tracing, which would export to OpenAI, is off (tests/clients/conftest.py).
"""

from __future__ import annotations

from typing import Any, Literal

import pytest

from api.http.openai.tools.spec import format_call
from tests.support.clients import in_asyncio, turns
from tests.support.servers import Server

CALL = format_call("function", "get_weather", '{"city": "Paris"}')
ANSWER = "It is sunny in Paris."
City = Literal["Paris", "Oslo", "Rome"]


def openai_agent(server: Server, api: str, calls: list[str], **settings: Any) -> tuple[Any, Any]:
    """(agent, its AsyncOpenAI client) on the Chat Completions ("chat") or Responses API."""
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)

    @function_tool
    def get_weather(city: City) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"sunny in {city}"

    client = AsyncOpenAI(base_url=server.openai_url, api_key="unused", max_retries=0)
    model_class = OpenAIChatCompletionsModel if api == "chat" else OpenAIResponsesModel
    model = model_class(model="tiny", openai_client=client)
    agent = Agent(name="weather", instructions="Answer with the weather tool.", tools=[get_weather], model=model, model_settings=ModelSettings(**settings))
    return agent, client


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_openai_agents_streamed_run_calls_the_tool(forced_server: Server, monkeypatch: pytest.MonkeyPatch, api: str) -> None:
    script = turns(monkeypatch, [CALL, ANSWER], step=1000)
    calls: list[str] = []

    async def run() -> tuple[Any, Any, list[str]]:
        from agents import Runner

        agent, client = openai_agent(forced_server, api, calls, include_usage=True)
        async with client:
            result = Runner.run_streamed(agent, "Weather in Paris?")
            kinds = [event.type async for event in result.stream_events()]
            return result.final_output, result.context_wrapper.usage, kinds

    final, usage, kinds = await in_asyncio(run)
    assert calls == ["Paris"] and final == ANSWER
    assert "run_item_stream_event" in kinds and usage.requests == 2
    assert usage.input_tokens == 14 and usage.output_tokens > 0  # the scripts' counts, both requests (item 4 on Responses)
    # The tool's result went back to the model in the second request.
    assert "sunny in Paris" in str(script.calls[1][0].messages)


async def test_openai_agents_real_generation_under_required(forced_server: Server) -> None:
    """No script: the tiny model writes the call under the grammar tool_choice="required"
    compiles, the SDK runs the tool with it, then (tool_choice reset to auto) answers."""
    calls: list[str] = []

    async def run() -> Any:
        from agents import Runner

        agent, client = openai_agent(forced_server, "chat", calls, tool_choice="required", max_tokens=24, temperature=0)
        async with client:
            result = Runner.run_streamed(agent, "Weather in Paris?", max_turns=3)
            async for _ in result.stream_events():
                pass
            return result.final_output

    final = await in_asyncio(run)
    assert len(calls) == 1 and calls[0] in ("Paris", "Oslo", "Rome")
    assert isinstance(final, str)


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_pydantic_ai_streamed_run_calls_the_tool(forced_server: Server, monkeypatch: pytest.MonkeyPatch, api: str) -> None:
    turns(monkeypatch, [CALL, ANSWER], step=1000)
    calls: list[str] = []

    async def run() -> tuple[str, Any]:
        from pydantic_ai import Agent
        from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
        from pydantic_ai.providers.openai import OpenAIProvider

        provider = OpenAIProvider(base_url=forced_server.openai_url, api_key="unused")
        model = (OpenAIChatModel if api == "chat" else OpenAIResponsesModel)("tiny", provider=provider)
        agent = Agent(model, instructions="Answer with the weather tool.", retries=0)

        @agent.tool_plain
        def get_weather(city: City) -> str:
            """The weather in a city."""
            calls.append(city)
            return f"sunny in {city}"

        async with agent.run_stream("Weather in Paris?") as result:
            text = "".join([delta async for delta in result.stream_text(delta=True)])
            return text, result.usage()

    text, usage = await in_asyncio(run)
    assert calls == ["Paris"] and text == ANSWER
    assert usage.requests == 2 and usage.tool_calls == 1 and usage.input_tokens == 14
