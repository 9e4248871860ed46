"""MindIE's per-token usage lists and error_behavior (the Databricks Completions request).

usage.batch_size: per generated token, the batch size of the step that produced it;
usage.queue_wait_time: per generated token, microseconds waited for it. error_behavior
"error" (default) rejects a prompt longer than the context; "truncate" keeps its tail and
generates from that.
"""

from __future__ import annotations

import random

import httpx
import trio

from tests.support.http import complete, stream_events
from tests.support.reference import Reference
from tests.support.servers import Server
from tests.support.waiting import in_thread


async def test_usage_lists_have_one_entry_per_generated_token(server: Server, http: httpx.AsyncClient) -> None:
    out = await complete(http, prompt="The quick brown", max_tokens=12, temperature=0, ignore_eos=True)
    usage = out["usage"]
    assert usage["completion_tokens"] == 12
    assert usage["batch_size"] == [1] * 12  # alone on the server: every step held only this request
    waits = usage["queue_wait_time"]
    assert len(waits) == 12 and all(isinstance(w, int) and w >= 0 for w in waits)
    assert sum(waits) > 0

    # A stop ends the lists with the generation.
    stopped = await complete(http, prompt="The quick brown", max_tokens=12, temperature=0, stop_token_ids=[51])
    n = stopped["usage"]["completion_tokens"]
    assert len(stopped["usage"]["batch_size"]) == len(stopped["usage"]["queue_wait_time"]) == n

    # n sequences: one entry per generated token of every sequence (MindIE's example: n=2 x 5
    # tokens gives 10 entries).
    two = await complete(http, prompt="The quick brown", n=2, max_tokens=5, temperature=1.0, ignore_eos=True)
    assert two["usage"]["completion_tokens"] == 10
    assert len(two["usage"]["batch_size"]) == len(two["usage"]["queue_wait_time"]) == 10

    # The streamed usage chunk carries them too.
    events = await stream_events(http, "/v1/completions", prompt="The quick brown", max_tokens=6, temperature=0, ignore_eos=True, stream_options={"include_usage": True})
    final = events[-1]
    assert final["choices"] == []
    assert len(final["usage"]["batch_size"]) == len(final["usage"]["queue_wait_time"]) == 6


async def test_batch_size_shows_concurrency(server: Server, http: httpx.AsyncClient) -> None:
    usages: list[dict] = []

    async def one(i: int) -> None:
        body = await complete(http, prompt=f"Request {i} says", max_tokens=16, temperature=0, ignore_eos=True)
        usages.append(body["usage"])

    async with trio.open_nursery() as nursery:
        for i in range(8):
            nursery.start_soon(one, i)
    assert len(usages) == 8
    for usage in usages:
        assert len(usage["batch_size"]) == len(usage["queue_wait_time"]) == usage["completion_tokens"] == 16
        assert all(1 <= b <= 8 for b in usage["batch_size"]), usage["batch_size"]
    assert max(max(u["batch_size"]) for u in usages) > 1
    # Most of the tokens were generated in shared steps.
    shared = sum(b > 1 for u in usages for b in u["batch_size"])
    assert shared >= 8 * 16 // 2, [u["batch_size"] for u in usages]


async def test_error_behavior_truncate(server: Server, http: httpx.AsyncClient, ref: Reference) -> None:
    context = server.runtime.max_model_len  # type: ignore[attr-defined]
    rng = random.Random(8)
    long_prompt = [rng.randrange(3, 300) for _ in range(context + 40)]

    r = await http.post("/v1/completions", json={"model": "tiny", "prompt": long_prompt, "max_tokens": 8})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "prompt" and err["code"] == "context_length_exceeded"
    r = await http.post("/v1/completions", json={"model": "tiny", "prompt": long_prompt, "max_tokens": 8, "error_behavior": "error"})
    assert r.status_code == 400

    out = await complete(http, prompt=long_prompt, max_tokens=8, temperature=0, ignore_eos=True, error_behavior="truncate")
    usage = out["usage"]
    # The tail is kept, leaving room for max_tokens inside the context.
    assert usage["prompt_tokens"] == context - 8
    assert usage["completion_tokens"] == 8
    assert usage["total_tokens"] == context
    kept = long_prompt[-usage["prompt_tokens"] :]
    greedy = await in_thread(ref.greedy, kept, 8)
    assert out["choices"][0]["text"] == ref.decode(greedy)
    assert out["choices"][0]["finish_reason"] == "length"

    # A prompt that fits but leaves no room for max_tokens: "error" names max_tokens,
    # "truncate" drops the oldest tokens to make room.
    fits = long_prompt[: context - 4]
    r = await http.post("/v1/completions", json={"model": "tiny", "prompt": fits, "max_tokens": 8})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    out = await complete(http, prompt=fits, max_tokens=8, temperature=0, ignore_eos=True, error_behavior="truncate")
    assert out["usage"]["prompt_tokens"] == context - 8 and out["usage"]["completion_tokens"] == 8

    # A short prompt is untouched by "truncate".
    short = await complete(http, prompt="The quick brown", max_tokens=4, temperature=0, ignore_eos=True, error_behavior="truncate")
    assert short["usage"]["prompt_tokens"] == len(ref.encode("The quick brown"))


async def test_truncated_echo_pairs_each_token_with_its_own_logprob(server: Server, http: httpx.AsyncClient, ref: Reference) -> None:
    """echo + logprobs on a truncated prompt: whatever part of the prompt is echoed, each
    token_logprobs entry must score the token beside it (None where the model never saw it)."""
    context = server.runtime.max_model_len  # type: ignore[attr-defined]
    rng = random.Random(8)
    long_prompt = [rng.randrange(3, 300) for _ in range(context + 40)]
    out = await complete(http, prompt=long_prompt, max_tokens=4, temperature=0, ignore_eos=True, error_behavior="truncate", echo=True, logprobs=0)
    kept = long_prompt[-out["usage"]["prompt_tokens"] :]
    got = out["choices"][0]["logprobs"]
    echoed = len(got["tokens"]) - 4
    assert echoed in (len(long_prompt), len(kept)), echoed
    dropped = echoed - len(kept)  # tokens echoed that the model never saw
    lp = await in_thread(ref.logprobs, kept)
    expected = [None] * (dropped + 1) + [float(lp[i - 1, kept[i]]) for i in range(1, len(kept))]
    actual = got["token_logprobs"][:echoed]
    wrong = [i for i, (a, e) in enumerate(zip(actual, expected)) if (a is None) != (e is None) or (a is not None and abs(a - e) > 1e-3)]
    assert not wrong, f"{len(wrong)} of {echoed} echoed positions scored wrongly, first {wrong[:5]}"
