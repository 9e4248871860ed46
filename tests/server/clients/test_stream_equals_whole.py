"""Streamed tool-call arguments, concatenated, equal the non-streamed arguments.

A property over many requests, two ways:
- real generation on the tiny model under the grammar a forcing tool_choice compiles, seeded
  (Chat's `seed`; Responses greedy), so the same request generates the same text streamed or
  not: function tools, a custom tool with a grammar, function and custom mixed (nothing of the
  opening prefilled then), n = 2;
- scripted turns drawn by hypothesis: text, then one to three calls (functions with arbitrary
  JSON arguments, a custom tool with arbitrary text), cut into deltas of any size, n = 2, so
  parallel calls and every split of a call's head from its first fragment are covered.
Streams are read raw and accumulated as a client does: by choice index and tool-call index,
`arguments` (or a custom call's `input`) concatenated.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from api.http.openai.tools.spec import format_call
from tests.support.clients import CHAT_FORECAST, CHAT_SHOUT, CHAT_WEATHER, RESP_FORECAST, RESP_SHOUT, RESP_WEATHER, script
from tests.support.waiting import in_thread

Calls = list[tuple[str, str, str]]  # (type, name, arguments or input)


def accumulate_chat(chunks: list[Any]) -> dict[int, tuple[str, Calls]]:
    """Per choice: (content, calls) as a client builds them from the deltas."""
    content: dict[int, str] = {}
    calls: dict[int, dict[int, list[str]]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            content[choice.index] = content.get(choice.index, "") + (choice.delta.content or "")
            for tc in choice.delta.tool_calls or []:
                raw = tc.to_dict()
                kind = raw.get("type") or calls[choice.index][tc.index][0]
                entry = calls.setdefault(choice.index, {}).setdefault(tc.index, [kind, "", ""])
                part = raw.get(kind, {})
                entry[1] += part.get("name", "")
                entry[2] += part.get("arguments" if kind == "function" else "input", "")
    return {i: (content[i], [(k, n, a) for k, n, a in (calls.get(i, {})[j] for j in sorted(calls.get(i, {})))]) for i in content}


def whole_chat(completion: Any) -> dict[int, tuple[str, Calls]]:
    out = {}
    for choice in completion.choices:
        calls = [(tc.type, *((tc.function.name, tc.function.arguments) if tc.type == "function" else (tc.custom.name, tc.custom.input))) for tc in choice.message.tool_calls or []]
        out[choice.index] = (choice.message.content or "", calls)
    return out


def responses_calls(output: list[Any]) -> Calls:
    return [(o.type, o.name, o.arguments if o.type == "function_call" else o.input) for o in output if o.type != "message"]


def streamed_responses_calls(events: list[Any]) -> Calls:
    items: dict[int, list[str]] = {}
    for e in events:
        if e.type == "response.output_item.added" and e.item.type != "message":
            items[e.output_index] = [e.item.type, e.item.name, e.item.arguments if e.item.type == "function_call" else e.item.input]
        elif e.type in ("response.function_call_arguments.delta", "response.custom_tool_call_input.delta"):
            items[e.output_index][2] += e.delta
    return [(k, n, a) for k, n, a in (items[i] for i in sorted(items))]


async def chat_streamed_and_whole(client: openai.OpenAI, **kwargs: Any) -> tuple[dict[int, tuple[str, Calls]], dict[int, tuple[str, Calls]]]:
    whole = await in_thread(client.chat.completions.create, model="tiny", **kwargs)
    chunks = await in_thread(lambda: list(client.chat.completions.create(model="tiny", stream=True, **kwargs)))
    return accumulate_chat(chunks), whole_chat(whole)


async def responses_streamed_and_whole(client: openai.OpenAI, **kwargs: Any) -> tuple[Calls, Calls]:
    whole = await in_thread(client.responses.create, model="tiny", **kwargs)
    events = await in_thread(lambda: list(client.responses.create(model="tiny", stream=True, **kwargs)))
    assert responses_calls(events[-1].response.output) == responses_calls(whole.output)
    return streamed_responses_calls(events), responses_calls(whole.output)


# -- real generation under the grammar ---------------------------------------------------------

CHAT_CASES = [
    ([CHAT_WEATHER, CHAT_FORECAST], "required"),
    ([CHAT_WEATHER, CHAT_SHOUT], "required"),  # mixed: nothing prefilled
    ([CHAT_SHOUT], {"type": "custom", "custom": {"name": "shout"}}),
    ([CHAT_FORECAST], {"type": "function", "function": {"name": "forecast"}}),
]


@pytest.mark.parametrize(("tools", "choice"), CHAT_CASES, ids=["functions", "mixed", "custom", "named"])
async def test_real_chat_calls_streamed_equal_whole(client: openai.OpenAI, tools: list[Any], choice: Any) -> None:
    called = 0
    for seed in range(4):
        streamed, whole = await chat_streamed_and_whole(
            client, messages=[{"role": "user", "content": f"Request {seed}"}], tools=tools, tool_choice=choice, n=2, seed=seed, temperature=1.2, max_tokens=60
        )
        assert streamed == whole, seed
        called += sum(len(calls) for _, calls in whole.values())
        assert all(content == "" for content, _ in whole.values())  # forced: no text
    assert called >= 8  # every choice of every request made at least one call


async def test_real_responses_calls_streamed_equal_whole(client: openai.OpenAI) -> None:
    for i, (tools, choice) in enumerate([([RESP_WEATHER, RESP_FORECAST], "required"), ([RESP_WEATHER, RESP_SHOUT], "required"), ([RESP_SHOUT], "required")] * 2):
        streamed, whole = await responses_streamed_and_whole(client, input=f"Request {i}", tools=tools, tool_choice=choice, temperature=0, max_output_tokens=60)
        assert streamed == whole and whole, i


# -- scripted turns drawn by hypothesis --------------------------------------------------------

FUNCTIONS = [{"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}} for i in range(2)]
CUSTOM = {"type": "custom", "custom": {"name": "c0"}}
RESPONSES_FUNCTIONS = [{"type": "function", "name": f"f{i}", "parameters": {"type": "object"}, "strict": False} for i in range(2)]
RESPONSES_CUSTOM = {"type": "custom", "name": "c0"}
_text = st.text(st.characters(codec="utf-8", exclude_characters="<\r", exclude_categories=["Cs", "Cc"]), min_size=1, max_size=12)
_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8), lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
_function_call = st.tuples(st.just("function"), st.sampled_from(["f0", "f1"]), st.dictionaries(st.text(max_size=6), _json, max_size=3).map(json.dumps))
_custom_call = st.tuples(st.just("custom"), st.just("c0"), st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=20).filter(lambda s: "</tool_call>" not in s))
TURNS = st.tuples(st.one_of(st.just(""), _text.filter(lambda s: s.strip() == s)), st.lists(_function_call | _custom_call, min_size=1, max_size=3), st.integers(1, 60))


def drawn_turns(count: int) -> list[tuple[str, Calls, int]]:
    turns: list[tuple[str, Calls, int]] = []

    @settings(max_examples=count, derandomize=True, database=None, deadline=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(TURNS)
    def collect(turn: tuple[str, Calls, int]) -> None:
        turns.append(turn)

    collect()
    return turns


async def test_scripted_calls_streamed_equal_whole(client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    for text, calls, step in drawn_turns(40):
        turn = (text + "\n" if text else "") + "\n".join(format_call(kind, name, body) for kind, name, body in calls)
        script(monkeypatch, turn, step=step)
        streamed, whole = await chat_streamed_and_whole(client, messages=[{"role": "user", "content": "go"}], tools=[*FUNCTIONS, CUSTOM], n=2, temperature=1)
        expected = {i: (text, calls) for i in range(2)}
        assert streamed == whole == expected, (turn, step)
        r_streamed, r_whole = await responses_streamed_and_whole(client, input="go", tools=[RESPONSES_CUSTOM, *RESPONSES_FUNCTIONS])
        assert r_streamed == r_whole == [("function_call" if k == "function" else "custom_tool_call", n, a) for k, n, a in calls], (turn, step)
