"""The official `openai` SDK's cases, run wherever a module's `client` fixture points: one node
(tests/server/http/test_openai_client.py) and both serve-ray topologies (tests/cluster/
test_basic_serving.py, test_serving_direct.py).

The SDK parses our bodies and SSE streams into its own types, so it judges our shapes. It is
synchronous here, run in a worker thread while a one-node server runs in the test's trio loop.
Test functions kept here, not in a test module, so each of those modules imports the cases it
passes (pytest collects an imported test function as the importing module's own) and no test
module imports another.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.support.waiting import in_thread


async def test_chat_non_streaming(client: openai.OpenAI) -> None:
    c = client
    resp = await in_thread(
        c.chat.completions.create,
        model="tiny",
        messages=[{"role": "user", "content": "hello there"}],
        max_tokens=12,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert resp.object == "chat.completion"
    assert resp.model == "tiny"
    choice = resp.choices[0]
    assert choice.message.role == "assistant"
    assert choice.finish_reason == "length"
    assert resp.usage is not None and resp.usage.completion_tokens == 12
    # The prompt count includes what the chat template adds around the user's text.
    assert resp.usage.prompt_tokens > len("hello there".split())
    assert resp.system_fingerprint and resp.system_fingerprint.startswith("fp_")


async def test_chat_streaming_matches_non_streaming(client: openai.OpenAI) -> None:
    c = client
    kwargs = dict(model="tiny", messages=[{"role": "user", "content": "stream me"}], max_tokens=16, temperature=0, extra_body={"ignore_eos": True})
    whole = await in_thread(c.chat.completions.create, **kwargs)

    def stream() -> list[Any]:
        return list(c.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))

    chunks = await in_thread(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(ch.choices[0].delta.role is None for ch in chunks[1:] if ch.choices)
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16


async def test_completions_streaming_and_not(client: openai.OpenAI) -> None:
    c = client
    kwargs = dict(model="tiny", prompt="The quick brown", max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
    whole = await in_thread(c.completions.create, **kwargs)
    assert whole.object == "text_completion"
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 10

    def stream() -> list[Any]:
        return list(c.completions.create(stream=True, **kwargs))

    chunks = await in_thread(stream)
    assert "".join(ch.choices[0].text for ch in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


async def test_stop_string_never_leaks(client: openai.OpenAI) -> None:
    c = client
    base = await in_thread(c.completions.create, model="tiny", prompt="Paged", max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    text = base.choices[0].text
    if len(text) < 6:
        pytest.skip("the random model produced too little text to cut")
    stop = text[3:6]

    def stream() -> list[Any]:
        return list(c.completions.create(model="tiny", prompt="Paged", max_tokens=24, temperature=0, stop=[stop], stream=True))

    chunks = await in_thread(stream)
    streamed = "".join(ch.choices[0].text for ch in chunks)
    assert streamed == text[: text.index(stop)]
    assert chunks[-1].choices[0].finish_reason == "stop"


async def test_models_and_unknown_model(client: openai.OpenAI) -> None:
    c = client
    models = await in_thread(c.models.list)
    assert [m.id for m in models.data] == ["tiny"]
    with pytest.raises(openai.NotFoundError):
        await in_thread(c.chat.completions.create, model="nope", messages=[{"role": "user", "content": "x"}])


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"temperature": 2.5}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 100000}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": 7}]}, "messages[0].content"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"n": 0}, "n"),
    ],
)
async def test_bad_input_gets_400_naming_the_field(client: openai.OpenAI, body: dict[str, Any], param: str) -> None:
    c = client
    payload = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **body}
    with pytest.raises(openai.BadRequestError) as info:
        await in_thread(c.chat.completions.create, **payload)
    err = info.value.body
    assert isinstance(err, dict), err
    assert err["param"] == param, err
    assert err["type"] == "invalid_request_error"
    # The engine is still fine afterwards.
    ok = await in_thread(c.chat.completions.create, model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert ok.choices[0].message.content is not None
