"""Chat Completions with generation controls, through the official openai SDK.

n choices, stream_options.include_usage (a final usage chunk with
completion_tokens_details.reasoning_tokens == 0), system_fingerprint, finish_reason values,
seed reproducibility and max_completion_tokens.
"""

from __future__ import annotations

from typing import Any

import openai

from tests.support.reference import Reference
from tests.support.waiting import in_thread

MESSAGES = [{"role": "user", "content": "hello there"}]


async def test_chat_n_choices(client: openai.OpenAI, ref: Reference) -> None:
    resp = await in_thread(
        client.chat.completions.create, model="tiny", messages=MESSAGES, n=2, max_tokens=8, temperature=1.0, seed=21, extra_body={"ignore_eos": True}
    )
    assert [c.index for c in resp.choices] == [0, 1]
    assert all(c.finish_reason == "length" for c in resp.choices)
    assert resp.choices[0].message.content != resp.choices[1].message.content
    assert resp.usage.prompt_tokens == len(ref.chat_ids(MESSAGES))  # the prompt once
    assert resp.usage.completion_tokens == 16
    assert resp.usage.completion_tokens_details.reasoning_tokens == 0
    assert resp.system_fingerprint and resp.system_fingerprint.startswith("fp_")

    again = await in_thread(
        client.chat.completions.create, model="tiny", messages=MESSAGES, n=2, max_tokens=8, temperature=1.0, seed=21, extra_body={"ignore_eos": True}
    )
    assert [c.message.content for c in again.choices] == [c.message.content for c in resp.choices]
    assert again.system_fingerprint == resp.system_fingerprint


async def test_chat_stream_n_with_usage(client: openai.OpenAI, ref: Reference) -> None:
    kwargs: dict[str, Any] = dict(model="tiny", messages=MESSAGES, n=2, max_tokens=6, temperature=1.0, seed=5, extra_body={"ignore_eos": True})
    whole = await in_thread(client.chat.completions.create, **kwargs)

    def stream() -> list[Any]:
        return list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))

    chunks = await in_thread(stream)
    texts: dict[int, str] = {0: "", 1: ""}
    finishes: dict[int, list[str | None]] = {0: [], 1: []}
    for ch in chunks[:-1]:
        assert ch.usage is None  # only the last chunk carries usage
        assert ch.system_fingerprint == whole.system_fingerprint
        for c in ch.choices:
            texts[c.index] += c.delta.content or ""
            finishes[c.index].append(c.finish_reason)
    assert texts == {c.index: c.message.content for c in whole.choices}
    for i in (0, 1):
        assert [f for f in finishes[i] if f is not None] == ["length"]
        assert finishes[i][-1] == "length"
    last = chunks[-1]
    assert last.choices == []
    assert last.usage.completion_tokens == 12
    assert last.usage.prompt_tokens == len(ref.chat_ids(MESSAGES))
    assert last.usage.total_tokens == last.usage.prompt_tokens + 12
    assert last.usage.completion_tokens_details.reasoning_tokens == 0


async def test_chat_finish_reasons_and_max_completion_tokens(client: openai.OpenAI, ref: Reference) -> None:
    ids = ref.chat_ids(MESSAGES)
    greedy = await in_thread(ref.greedy, ids, 6)
    stop_id = greedy[4]
    seen = set()
    for extra in ({"max_completion_tokens": 6}, {"max_tokens": 6}, {"max_tokens": 12, "extra_body": {"ignore_eos": True, "stop_token_ids": [stop_id]}}):
        resp = await in_thread(client.chat.completions.create, model="tiny", messages=MESSAGES, temperature=0, **extra)
        choice = resp.choices[0]
        assert choice.finish_reason in {"stop", "length"}
        seen.add(choice.finish_reason)
        if choice.finish_reason == "length":
            assert resp.usage.completion_tokens == 6
            assert choice.message.content == ref.decode(greedy)
        else:
            assert resp.usage.completion_tokens == greedy.index(stop_id) + 1
            assert choice.message.content == ref.decode(greedy[: greedy.index(stop_id)])
    assert seen == {"stop", "length"}
