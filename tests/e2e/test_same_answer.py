"""Same request, same answer, on the default configuration (slow: the embedded model's real weights).

The server runs as `make serve` does: the embedded SmolLM2-135M's shipped Q4_1 blocks, bf16
activations, the default flags (only the port, a smaller KV cache and n-gram drafting named,
so that the tests can force drafting on and off: `tests/support/spec.py` `DraftSwitch`).
Through the `openai` SDK, each request of a set (Completions greedy with logprobs, seeded, and
`top_k: 1`; Chat greedy and seeded with logprobs; Responses streamed and not) must give the
same text and the same logprobs, float for float:
- with drafting off, its prefix cache cold, then warm;
- with every step drafting, its cache cold and warm (drafts kept: verify rows gave the tokens);
- beside 31 other streams.
There are no compiled graphs to swap in on this path (`model_impl` says `+rowwise`, never
`+compiled`). A planted shape-dependent kernel (a product rounded otherwise when it holds more
than one row) makes the same checks fail.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest
import torch
import trio

from actors.runners.native.kernels import ops
from tests.support.device import needs_kernels
from tests.support.servers import Server
from tests.support.spec import DraftSwitch
from tests.support.waiting import in_thread

pytestmark = [pytest.mark.slow, needs_kernels()]

NEW = 20
STORY = "Once upon a time, in a small village by the sea, there lived an old fisherman who"
FACTS = "The three largest planets of the solar system are"


def _completion(client: openai.OpenAI, prompt: str, **kw: Any) -> tuple:
    r = client.completions.create(model="smollm2-135m-instruct", prompt=prompt, max_tokens=NEW, logprobs=3, **kw)
    c = r.choices[0]
    return c.text, c.logprobs.token_logprobs, c.logprobs.top_logprobs


def _chat(client: openai.OpenAI, content: str, **kw: Any) -> tuple:
    r = client.chat.completions.create(
        model="smollm2-135m-instruct", messages=[{"role": "user", "content": content}], max_tokens=NEW, logprobs=True, top_logprobs=2, **kw
    )
    c = r.choices[0]
    return c.message.content, [(t.token, t.logprob, [(x.token, x.logprob) for x in t.top_logprobs]) for t in c.logprobs.content]


def _responses(client: openai.OpenAI, text: str, stream: bool) -> str:
    if not stream:
        return client.responses.create(model="smollm2-135m-instruct", input=text, max_output_tokens=NEW, temperature=0).output_text
    with client.responses.stream(model="smollm2-135m-instruct", input=text, max_output_tokens=NEW, temperature=0) as events:
        return events.get_final_response().output_text


def answers(client: openai.OpenAI, tag: str) -> dict[str, Any]:
    """Every request of the set once; `tag` keeps one set's prompts apart from another's."""
    story, facts = f"{STORY} ({tag})", f"{FACTS} ({tag})"
    return {
        "greedy": _completion(client, story, temperature=0),
        "seeded": _completion(client, facts, temperature=1.0, seed=1234),
        "top_k_1": _completion(client, story, temperature=1.0, seed=7, extra_body={"top_k": 1}),
        "chat_greedy": _chat(client, facts, temperature=0),
        "chat_seeded": _chat(client, story, temperature=0.9, seed=99),
        "responses": _responses(client, facts, stream=False),
        "responses_streamed": _responses(client, facts, stream=True),
    }


async def crowd(base_url: str, n: int, done: trio.Event) -> None:
    """`n` other streams, long and sampled, until `done`."""

    async def one(i: int) -> None:
        client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
        while not done.is_set():
            await in_thread(client.completions.create, model="smollm2-135m-instruct", prompt=f"Stream {i}: tell a long story about ships.", max_tokens=48, temperature=1.0, extra_body={"ignore_eos": True})

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(one, i)


async def beside(server: Server, n: int, tag: str) -> dict[str, Any]:
    """The set's answers while `n` other streams run."""
    done = trio.Event()
    client = openai.OpenAI(base_url=server.openai_url, api_key="unused")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(crowd, server.openai_url, n, done)
        await trio.sleep(1.0)  # the crowd is streaming
        got = await in_thread(answers, client, tag)
        done.set()
    return got


def differences(reference: dict[str, Any], other: dict[str, Any]) -> list[str]:
    return [name for name in reference if reference[name] != other[name]]


async def test_the_same_request_gets_the_same_answer_on_the_default_configuration(served_default: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime: Any = served_default.runtime
    assert runtime.info.impl == "native+q4_1+rowwise" and runtime.info.dtype == "bfloat16" and runtime.info.rowwise
    drafts = DraftSwitch(monkeypatch, on=False)
    client = openai.OpenAI(base_url=served_default.openai_url, api_key="unused")
    cold = await in_thread(answers, client, "a")
    assert cold["greedy"][0] and cold["top_k_1"] == cold["greedy"] and cold["responses_streamed"] == cold["responses"]
    assert differences(cold, await in_thread(answers, client, "a")) == []  # the prefix cache warm
    drafts.on = True
    assert differences(cold, await in_thread(answers, client, "a")) == []  # every step drafting
    assert differences(cold, await beside(served_default, 31, "a")) == []
    drafted_cold = await in_thread(answers, client, "b")  # a set first seen drafting: cold, with drafts
    drafts.on = False
    assert differences(drafted_cold, await in_thread(answers, client, "b")) == []
    stats = runtime.statistics()
    assert stats["spec_accepted_tokens"] > 0, stats


async def test_a_planted_shape_dependent_kernel_fails_the_same_checks(served_default: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    real = ops.linear

    def planted(x: torch.Tensor, w: ops.Packed, out_f32: bool = False, residual: torch.Tensor | None = None, **norm: Any) -> torch.Tensor:
        """Past one row, a plain product's bf16 output truncated instead of rounded to nearest."""
        if x.shape[0] == 1 or out_f32 or residual is not None or w.swiglu:
            return real(x, w, out_f32, residual, **norm)
        full = real(x, w, out_f32=True, **norm)  # with its bias, unrounded
        return (full.view(torch.int32) & ~0xFFFF).view(torch.float32).bfloat16()

    monkeypatch.setattr(ops, "linear", planted)
    runtime: Any = served_default.runtime  # its layers through ops.linear, one call each, not one stack call (ops.Stack)
    monkeypatch.setattr(runtime.runner.model.model, "stacks", [None, None])
    DraftSwitch(monkeypatch, on=False)
    client = openai.OpenAI(base_url=served_default.openai_url, api_key="unused")
    cold = await in_thread(answers, client, "c")
    assert differences(cold, await beside(served_default, 3, "c")) != []  # decoded beside others: rows of many
