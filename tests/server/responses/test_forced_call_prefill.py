"""A forced call's fixed opening is prefilled, not generated: the call's wrapper costs as few
tokens as the model's own format allows.

With tool_choice naming a tool (or `required` with one tool), everything up to the arguments,
`<tool_call>\\n{"name": "get_weather", "arguments":`, is known before the model runs. It used
to be generated token by token under the grammar, a decode step each; the prompt now ends
with it (`Guide.prefix`) and the model generates only the arguments and the closing. The
client sees the same calls, whole and streamed, through the real openai SDK; usage counts
the prefilled opening as prompt tokens, since it was prefilled, and completion_tokens counts
only what was generated. Real generation on the tiny model under the real grammar.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
import trio

from api.http.openai.tools.grammar import tool_guide
from api.http.openai.tools.parser import ToolCallParser
from api.http.openai.tools.validate import build_toolset
from tests.support.servers import start_server, tiny_config
from tests.support.waiting import in_thread

# One enum key: whatever the random model picks, the arguments are {"unit": "c"} or "f".
SCHEMA = {"type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["unit"], "additionalProperties": False}
CHAT_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather.", "parameters": SCHEMA}}
RESPONSES_TOOL = {"type": "function", "name": "get_weather", "description": "Weather.", "parameters": SCHEMA}
OPENING = '<tool_call>\n{"name": "get_weather", "arguments":'
CLOSING = "}\n</tool_call>"
MESSAGES = [{"role": "user", "content": "Weather?"}]
EOS = "<|im_end|>"  # the tiny tokenizer's: the grammar's end lets only it through


@pytest.fixture
async def client(long_model_dir: Path) -> AsyncIterator[openai.OpenAI]:
    async with trio.open_nursery() as nursery:
        server = await start_server(nursery, tiny_config(long_model_dir, max_num_batched_tokens=256))
        with openai.OpenAI(base_url=server.openai_url, api_key="unused", max_retries=0, timeout=120) as c:
            yield c
        server.stop.set()


def test_the_opening_is_the_guides_prefix_for_a_forced_call() -> None:
    named = tool_guide(build_toolset([CHAT_TOOL], {"type": "function", "function": {"name": "get_weather"}}, True), None)
    one = tool_guide(build_toolset([CHAT_TOOL], "required", False), None)
    assert named is not None and one is not None and named.prefix == one.prefix == OPENING
    other = {"type": "function", "function": {"name": "get_time", "parameters": SCHEMA}}
    several = tool_guide(build_toolset([CHAT_TOOL, other], "required", True), None)
    assert several is not None and several.prefix == '<tool_call>\n{"name": "'
    auto = tool_guide(build_toolset([CHAT_TOOL], "auto", True), None)
    assert auto is not None and auto.prefix == ""  # the model may answer in text: nothing is fixed


@pytest.mark.parametrize("choice", [{"type": "function", "function": {"name": "get_weather"}}, "required"])
async def test_only_the_arguments_and_closing_are_generated(client: openai.OpenAI, choice: Any) -> None:
    out = await in_thread(
        client.chat.completions.create, model="tiny", messages=MESSAGES, tools=[CHAT_TOOL], tool_choice=choice,
        parallel_tool_calls=False, temperature=0, max_tokens=64, logprobs=True,
    )
    [call] = out.choices[0].message.tool_calls
    arguments = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and arguments in ({"unit": "c"}, {"unit": "f"})
    assert out.choices[0].finish_reason == "tool_calls"
    generated = "".join(t.token for t in out.choices[0].logprobs.content)
    # What the decode steps made: the arguments, the closing and the end, none of the opening.
    assert generated == " " + json.dumps(arguments) + CLOSING + EOS, generated
    assert out.usage.completion_tokens == len(out.choices[0].logprobs.content)
    # No more steps than the arguments' tokens, the closing's and the end-of-sequence token
    # (a token is a character at worst in the tiny byte-level vocabulary); the opening alone
    # used to take more than the whole of this.
    assert out.usage.completion_tokens <= len(" " + json.dumps(arguments)) + len(CLOSING) + 1


async def test_chat_sdk_reads_the_call_whole_and_streamed(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = dict(
        model="tiny", messages=MESSAGES, tools=[CHAT_TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}}, temperature=0, max_tokens=64
    )
    whole = await in_thread(client.chat.completions.create, **kwargs)
    [call] = whole.choices[0].message.tool_calls
    assert whole.choices[0].message.content is None and call.id.startswith("call_")

    def stream() -> list[Any]:
        return list(client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))

    chunks = await in_thread(stream)
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert deltas[0].function.name == "get_weather" and deltas[0].id.startswith("call_")
    assert {d.index for d in deltas} == {0}
    assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments
    assert not any(c.choices[0].delta.content for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


async def test_responses_sdk_reads_the_call_whole_and_streamed(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = dict(
        model="tiny", input="Weather?", tools=[RESPONSES_TOOL], tool_choice={"type": "function", "name": "get_weather"}, temperature=0, max_output_tokens=64
    )
    whole = await in_thread(client.responses.create, **kwargs)
    [call] = whole.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    assert json.loads(call.arguments) in ({"unit": "c"}, {"unit": "f"})

    def stream() -> list[Any]:
        return list(client.responses.create(**kwargs, stream=True))

    events = await in_thread(stream)
    final = events[-1].response
    assert final.status == "completed" and [o.type for o in final.output] == ["function_call"]
    assert "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta") == call.arguments == final.output[0].arguments
    assert whole.usage.output_tokens <= len(" " + call.arguments) + len(CLOSING) + 1  # the opening was prefilled


async def test_several_tools_share_only_the_name_opening(client: openai.OpenAI) -> None:
    tools = [{"type": "function", "function": {"name": name}} for name in ("get_weather", "get_time")]
    out = await in_thread(
        client.chat.completions.create, model="tiny", messages=MESSAGES, tools=tools, tool_choice="required",
        parallel_tool_calls=False, temperature=0, max_tokens=64, logprobs=True,
    )
    [call] = out.choices[0].message.tool_calls
    assert call.function.name in ("get_weather", "get_time") and isinstance(json.loads(call.function.arguments), dict)
    generated = "".join(t.token for t in out.choices[0].logprobs.content)
    assert generated == f'{call.function.name}", "arguments": {call.function.arguments}{CLOSING}{EOS}', generated


def test_the_parser_reads_the_prefix_as_output() -> None:
    toolset = build_toolset([CHAT_TOOL], {"type": "function", "function": {"name": "get_weather"}}, True)
    assert toolset is not None
    whole = ToolCallParser(toolset)
    expected = whole.feed(OPENING + ' {"unit": "c"}' + CLOSING) + whole.finish()
    prefixed = ToolCallParser(toolset, OPENING)
    events = [e for piece in (' {"un', 'it": "c"}}', "\n</tool_", "call>") for e in prefixed.feed(piece)] + prefixed.finish()
    assert [e[0] for e in events] == ["start", "delta", "delta", "done"] and [e[0] for e in expected] == ["start", "delta", "done"]
    assert "".join(e[2] for e in events if e[0] == "delta") == '{"unit": "c"}' == whole.calls[0].text
    assert [c.text for c in prefixed.calls] == ['{"unit": "c"}'] and prefixed.calls[0].complete
    cut = ToolCallParser(toolset, OPENING)  # nothing generated after the prefix: a cut-off call, not text
    events = cut.finish()
    assert [e[0] for e in events] == ["start", "done"] and not cut.calls[0].complete
