"""Tool calls in each family's own format, through the `openai` SDK, on the family's real chat
template and tokens (tests/support/families.py), with a scripted model that writes the family's
own call (tests/support/scripted_runner.py) through the real engine, grammar masks included.

For every family: the format the template teaches is detected; the call comes back as a
`tool_calls` entry, whole and streamed (the SDK's stream helper), under `tool_choice: auto`
and forced (the family's call passes the forcing grammar token by token); the second turn,
with the tool's result, renders through the template (ids in the style it checks) and
answers 200. gpt-oss's analysis channel comes back as `reasoning`. Where the format takes
several calls a turn, two come back in order (whole and streamed) and render back; with
`parallel_tool_calls: false` the grammar lets one through; under `tool_choice: none` the model
is shown no tools and its answer is text.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
import trio

from tests.support.families import ANSWER, ASK, ASK2, FAMILIES, NO_TOOLS, RESPONSES_WEATHER, WEATHER, Family, answer_for, family_tokenizer
from tests.support.scripted_runner import scripted_engine
from tests.support.servers import Server, start_runtime_server
from tests.support.waiting import in_thread


@pytest.fixture(params=sorted(FAMILIES))
async def family_server(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Family, Server, openai.OpenAI]]:
    family = FAMILIES[request.param]
    tokenizer = await trio.to_thread.run_sync(family_tokenizer, family.name)
    eos = [tokenizer.convert_tokens_to_ids(t) for t in {family.eos, "<|return|>", "<|call|>"} if t in tokenizer.get_vocab()]
    engine = scripted_engine(tokenizer, answer_for(family), eos)
    async with trio.open_nursery() as nursery:
        server = await start_runtime_server(nursery, engine)
        # the client's keep-alive connection would hold the server's stop up for hypercorn's graceful period
        with openai.OpenAI(base_url=server.openai_url, api_key="unused", max_retries=0, timeout=60) as client:
            yield family, server, client
        server.stop.set()


def chat(client: openai.OpenAI, **kwargs: Any) -> Any:
    return client.chat.completions.create(model="family", max_tokens=200, **kwargs)


def streamed(client: openai.OpenAI, **kwargs: Any) -> Any:
    with client.chat.completions.stream(model="family", max_tokens=200, **kwargs) as stream:
        return stream.get_final_completion()


def the_call(completion: Any) -> Any:
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}, call
    return call


async def test_a_family_calls_in_its_own_format_and_reads_the_result(family_server: tuple[Family, Server, openai.OpenAI]) -> None:
    family, server, client = family_server
    engine: Any = server.runtime
    assert engine.tool_format == family.tool_format
    card = await in_thread(client.models.retrieve, "family")
    assert card.model_extra["tool_call_parser"] == family.tool_format
    whole = the_call(await in_thread(chat, client, messages=ASK, tools=[WEATHER]))
    the_call(await in_thread(streamed, client, messages=ASK, tools=[WEATHER]))
    forced = {"type": "function", "function": {"name": "get_weather"}}
    the_call(await in_thread(chat, client, messages=ASK, tools=[WEATHER], tool_choice=forced))
    the_call(await in_thread(chat, client, messages=ASK, tools=[WEATHER], tool_choice="required"))
    if family.tool_format == "mistral":
        assert re.fullmatch(r"[A-Za-z0-9]{9}", whole.id), whole.id
    if family.tool_format == "openai":
        completion = await in_thread(chat, client, messages=ASK, tools=[WEATHER])
        assert completion.choices[0].message.model_extra["reasoning"] == "The user wants the weather."
    for call_id in (whole.id, "call_from_another_provider_0123"):  # ours, and one the template would refuse as it is
        turn = [
            *ASK,
            {"role": "assistant", "content": None, "tool_calls": [{**whole.model_dump(), "id": call_id}]},
            {"role": "tool", "tool_call_id": call_id, "content": '{"temp": 21}'},
        ]
        reply = await in_thread(chat, client, messages=turn, tools=[WEATHER])
        assert reply.choices[0].message.content == ANSWER and reply.choices[0].finish_reason == "stop", reply
    rendered = engine.runner.prompts[-1]
    assert "21" in rendered and "get_weather" in rendered  # the template rendered the call and its result


LARK_TOOL = {"type": "custom", "name": "shell", "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "ls" | "pwd"'}}


async def test_the_responses_api_reads_each_familys_call_and_its_result(family_server: tuple[Family, Server, openai.OpenAI]) -> None:
    family, server, client = family_server

    def respond(**kwargs: Any) -> Any:
        with client.responses.stream(model="family", max_output_tokens=200, **kwargs) as stream:
            return stream.get_final_response()

    response = await in_thread(respond, input=ASK[0]["content"], tools=[RESPONSES_WEATHER])
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}, response.output
    turn = [
        {"role": "user", "content": ASK[0]["content"]},
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"temp": 21}'},
    ]
    reply = await in_thread(respond, input=turn, tools=[RESPONSES_WEATHER])
    assert reply.output_text == ANSWER, reply.output
    try:
        await in_thread(respond, input="hi", tools=[RESPONSES_WEATHER, LARK_TOOL])
        refused = None
    except openai.BadRequestError as error:
        refused = error.body
    if family.tool_format == "hermes":  # writes a custom tool's input raw: its grammar applies
        assert refused is None
    else:  # a JSON string (or an unforced value) no Lark grammar can hold: a 400 naming the tool's format
        assert refused is not None and refused["param"] == "tools[1].format", refused


async def test_a_familys_two_calls_one_without_parallel_calls_and_none_under_none(family_server: tuple[Family, Server, openai.OpenAI]) -> None:
    family, server, client = family_server
    engine: Any = server.runtime
    none = (await in_thread(chat, client, messages=ASK, tools=[WEATHER], tool_choice="none")).choices[0]
    assert none.finish_reason == "stop" and not none.message.tool_calls and none.message.content == NO_TOOLS, none
    assert "get_weather" not in engine.runner.prompts[-1]
    the_call(await in_thread(chat, client, messages=ASK2, tools=[WEATHER], parallel_tool_calls=False))
    if family.calls2 is None:  # one call a turn; Llama 3.1's template refuses a history with two
        if family.tool_format == "llama3_json":
            two = [
                {"id": f"call_{c}", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": c})}} for c in ("Paris", "London")
            ]
            with pytest.raises(openai.BadRequestError) as refused:
                await in_thread(chat, client, messages=[*ASK2, {"role": "assistant", "content": None, "tool_calls": two}], tools=[WEATHER])
            assert refused.value.body["param"] == "messages[1].tool_calls", refused.value.body  # type: ignore[index]
        return
    for completion in (await in_thread(chat, client, messages=ASK2, tools=[WEATHER]), await in_thread(streamed, client, messages=ASK2, tools=[WEATHER])):
        choice = completion.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        calls = choice.message.tool_calls
        assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
            ("get_weather", {"city": "Paris"}),
            ("get_weather", {"city": "London"}),
        ], calls
        assert len({c.id for c in calls}) == 2, calls
    results = [{"role": "tool", "tool_call_id": c.id, "content": json.dumps({"temp": t})} for c, t in zip(calls, (21, 15), strict=True)]
    turn = [*ASK2, {"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls]}, *results]
    reply = await in_thread(chat, client, messages=turn, tools=[WEATHER])
    assert reply.choices[0].message.content == ANSWER, reply
    rendered = engine.runner.prompts[-1]
    assert "London" in rendered and "15" in rendered and rendered.count("get_weather") >= 3  # the tool, both calls
