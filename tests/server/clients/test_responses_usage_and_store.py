"""What agent frameworks and coding agents expect of /v1/responses.

- Usage is in every final Response, streamed or not: `response.completed`,
  `response.incomplete` and `response.failed` (with the tokens counted so far) carry it
  without `stream_options.include_usage`, which OpenAI's SDK has no way to send and the
  frameworks never send; they read usage there, and reported 0 tokens for streamed runs.
- `store: false` is accepted (coding agents send it on every call; nothing is stored either
  way); `store: true` is still refused.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from actors.runners import torch_runner
from runtime.messages import FinishReason
from tests.support.clients import script
from tests.support.waiting import in_thread


def stream_events(client: openai.OpenAI, **kwargs: Any) -> list[Any]:
    return list(client.responses.create(model="tiny", stream=True, **kwargs))


async def test_streamed_usage_without_asking(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = dict(input="Tell me a story", temperature=0, max_output_tokens=12)
    whole = await in_thread(client.responses.create, model="tiny", **kwargs)

    def helper() -> Any:
        # The helper's get_final_response() wants response.completed; the random model may
        # well hit max_output_tokens (response.incomplete), so read the terminal event.
        with client.responses.stream(model="tiny", **kwargs) as stream:
            return [e for e in stream if e.type in ("response.completed", "response.incomplete")][-1].response

    final = await in_thread(helper)
    assert final.usage is not None and whole.usage is not None
    counts = [(u.input_tokens, u.output_tokens, u.total_tokens) for u in (final.usage, whole.usage)]  # (the prefix cache may differ)
    assert counts[0] == counts[1] and final.usage.input_tokens > 0
    assert final.usage.total_tokens == final.usage.input_tokens + final.usage.output_tokens


async def test_incomplete_response_carries_usage(client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    script(monkeypatch, "one two three", step=4, finish=FinishReason.LENGTH)
    events = await in_thread(stream_events, client, input="count")
    last = events[-1]
    assert last.type == "response.incomplete" and last.response.usage is not None
    assert (last.response.usage.input_tokens, last.response.usage.output_tokens) == (7, 4)  # the script's counts


@pytest.mark.in_process  # makes the runner's sampling raise
async def test_failed_response_carries_the_usage_so_far(client: openai.OpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fault inside the engine after three tokens: response.failed, usage as counted."""
    real_sample = torch_runner.sample
    calls = []

    def sample(logits: Any, batch: Any) -> Any:
        calls.append(1)
        if len(calls) > 3:
            raise RuntimeError("injected sampling fault")
        return real_sample(logits, batch)

    monkeypatch.setattr(torch_runner, "sample", sample)
    events = await in_thread(stream_events, client, input="Tell me a story", temperature=0, max_output_tokens=12)
    last = events[-1]
    assert last.type == "response.failed" and "request id" in last.response.error.message  # the fault's text goes to the log only
    assert "injected" not in last.response.error.message
    usage = last.response.usage
    assert usage is not None and usage.input_tokens > 0 and usage.output_tokens == 3, usage


async def test_store_false_is_accepted_and_true_refused(client: openai.OpenAI) -> None:
    resp = await in_thread(client.responses.create, model="tiny", input="hi", max_output_tokens=2, store=False)
    assert resp.status in ("completed", "incomplete") and resp.store is False
    events = await in_thread(stream_events, client, input="hi", max_output_tokens=2, store=False)
    assert events[-1].type in ("response.completed", "response.incomplete")
    with pytest.raises(openai.BadRequestError) as info:
        await in_thread(client.responses.create, model="tiny", input="hi", max_output_tokens=2, store=True)
    assert info.value.body["param"] == "store" and info.value.body["code"] == "unsupported_parameter"
