"""Overload: 10x the admission limit at once. The excess is refused at once (429 + Retry-After),
every admitted request completes, nothing hangs; by request count and by token budget.

The latency bound here is deliberately generous (flaky timing asserts help nobody on a shared
2-core box); `ops/overload.py` measures the real rejection latency.
"""

from __future__ import annotations

import json
from collections import Counter
from urllib.parse import urlsplit

import httpx
import pytest
import trio

from runtime.config import RuntimeConfig
from runtime.engine import estimate_tokens
from runtime.request import Prompt
from runtime.sampling import SamplingParams
from ops.overload import burst
from tests.fakes import fake_runtime
from tests.production.conftest import serves_normally, sse_payloads, start_runtime_server, wait_idle

MAX_TOKENS = 16
BURST = 80  # 10x the admission limit of 8


def host_port(base_url: str) -> tuple[str, int]:
    url = urlsplit(base_url)
    return url.hostname or "127.0.0.1", url.port or 80


def check_burst(results: list[dict], limit: int) -> list[dict]:
    """The excess was refused quickly with 429 + Retry-After; every admitted request completed."""
    statuses = Counter(r["status"] for r in results)
    assert set(statuses) <= {200, 429}, statuses  # 0 would be a request that hung past its timeout
    assert statuses[200] >= limit and statuses[429] >= BURST // 2, statuses
    admitted = [r for r in results if r["status"] == 200]
    assert all(r["complete"] for r in admitted), [r["body"][:200] for r in admitted if not r["complete"]]
    refused = [r for r in results if r["status"] == 429]
    for r in refused:
        assert b"\r\nretry-after: " in r["head"].lower()
        assert json.loads(r["body"])["error"]["type"] == "rate_limit_error"
    latencies = sorted(r["first"] for r in refused)
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    # Generous on purpose: 80 requests land at once on a shared 2-core box (up to 0.54 s seen
    # under other engineers' load, 0.07-0.16 s when quiet); ops/overload.py measures for real.
    assert p99 < 1.0, f"p99 rejection latency {p99:.3f}s"
    return refused


async def test_ten_times_the_request_limit(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    config = RuntimeConfig(served_name="fake", port=0, max_pending=8, drain_timeout=2.0)
    runtime = fake_runtime(tiny_model_dir, config, step_delay=0.01)
    async with trio.open_nursery() as nursery:
        srv = await start_runtime_server(nursery, runtime)
        await serves_normally(srv.base_url)  # warm: first-request costs are not admission's
        body = {"prompt": "The quick brown fox", "max_tokens": MAX_TOKENS, "ignore_eos": True}
        with trio.fail_after(60):  # none hangs
            check_burst(await burst(*host_port(srv.base_url), BURST, body, timeout=30), limit=8)
        await wait_idle(runtime)

        # While full, the edge sheds new requests before the app decodes them, streaming or not,
        # with the same 429; the admitted streams are untouched.
        runtime.runner.release.clear()  # hold the device: admitted requests stay in flight
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=30) as http:
            admitted: list[list[str]] = []

            async def stream() -> None:
                req = {**body, "stream": True}
                async with http.stream("POST", "/v1/completions", json=req) as resp:
                    assert resp.status_code == 200
                    admitted.append(sse_payloads((await resp.aread()).decode()))

            with trio.fail_after(30):
                async with trio.open_nursery() as streams:
                    for _ in range(8):
                        streams.start_soon(stream)
                    while len(runtime.requests) < 8:
                        await trio.sleep(0.01)
                    for stream_flag in (True, False) * 4:
                        r = await http.post("/v1/completions", json={**body, "stream": stream_flag})
                        assert r.status_code == 429 and r.headers["retry-after"] == "1", r.text
                        assert r.json()["error"]["code"] == "overloaded"
                    runtime.runner.release.set()
            assert len(admitted) == 8 and all(events[-1] == "[DONE]" for events in admitted)
            m = (await http.get("/metrics")).text
            assert 'switchyard_http_requests_total{model="",route="/v1/completions",status="429"}' in m
        await wait_idle(runtime)
        await serves_normally(srv.base_url)
        srv.stop.set()


async def test_ten_times_the_token_budget(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    # Each request is estimated at 12 bytes / 4 + 1 = 4 (prompt) + 16 (max_tokens) = 20 tokens: 8 fit in 160.
    config = RuntimeConfig(served_name="fake", port=0, max_pending_tokens=160, drain_timeout=2.0)
    runtime = fake_runtime(tiny_model_dir, config, step_delay=0.01)
    async with trio.open_nursery() as nursery:
        srv = await start_runtime_server(nursery, runtime)
        await serves_normally(srv.base_url)
        body = {"prompt": "Hello there!", "max_tokens": MAX_TOKENS, "ignore_eos": True}
        with trio.fail_after(60):
            refused = check_burst(await burst(*host_port(srv.base_url), BURST, body, timeout=30), limit=8)
        assert "tokens are pending" in json.loads(refused[0]["body"])["error"]["message"]
        await wait_idle(runtime)
        await serves_normally(srv.base_url)
        srv.stop.set()


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "expected"),
    [
        (Prompt(token_ids=[1, 2, 3]), 10, 13),
        (Prompt(text="abcdefgh"), 10, 13),  # 8 bytes / 4 + 1
        (Prompt(messages=[{"role": "user", "content": "abcd"}, {"role": "user", "content": [{"type": "text", "text": "abcdefgh"}]}]), 1, 4 + 1 + 4 + 2 + 1),
        (Prompt(token_ids=[1] * 10), None, 100),  # no max_tokens: the whole context
        (Prompt(token_ids=[1] * 500), 500, 100),  # never more than one context
    ],
)
def test_token_estimate(prompt: Prompt, max_tokens: int | None, expected: int) -> None:
    assert estimate_tokens(prompt, SamplingParams(max_tokens=max_tokens), max_model_len=100) == expected
