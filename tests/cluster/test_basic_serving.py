"""serve-ray serving: two replicas serve, SSE crosses the hop token by token, a disconnect
frees the replica's blocks, and the official openai client passes its single-node tests.

Every request here goes through Ray's HTTP proxy, the ingress and a replica. A replica is
reached on purpose with `x-session-id` (the router keeps a session on one replica).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import openai
import pytest
import trio

# The same cases the openai SDK passes against one node (tests/api/test_openai_client.py),
# here against the cluster through the `client` fixture below.
from tests.api.test_openai_client import (  # noqa: F401
    test_bad_input_gets_400_naming_the_field,
    test_chat_non_streaming,
    test_chat_streaming_matches_non_streaming,
    test_completions_streaming_and_not,
    test_models_and_unknown_model,
    test_stop_string_never_leaks,
)
from tests.cluster.conftest import Cluster
from tests.production.test_observability import samples, value

REPLICA = "x-switchyard-replica"
LONG = {"model": "tiny", "prompt": "Paged attention keeps keys", "max_tokens": 450, "stream": True, "ignore_eos": True}


@pytest.fixture
def client(cluster: Cluster) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=cluster.openai_url, api_key="unused", max_retries=0, timeout=60) as c:
        yield c


async def test_two_replicas_both_serve(cluster: Cluster) -> None:
    seen: dict[str, int] = {}
    async with httpx.AsyncClient(base_url=cluster.base_url, timeout=60) as http:
        for i in range(24):
            body = {"model": "tiny", "messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 3}
            r = await http.post("/v1/chat/completions", json=body, headers={"x-session-id": f"user-{i}"})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"] is not None
            seen[r.headers[REPLICA]] = seen.get(r.headers[REPLICA], 0) + 1
    assert len(seen) == 2, seen


async def test_sse_arrives_incrementally_and_ends_with_done(cluster: Cluster) -> None:
    """Each token's event is its own socket read, spread over the generation: nothing on the
    way (replica -> ingress -> proxy) holds chunks back to batch them."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "count"}], "max_tokens": 40, "stream": True, "ignore_eos": True}
    reads: list[tuple[float, bytes]] = []
    async with httpx.AsyncClient(base_url=cluster.base_url, timeout=60) as http:
        async with http.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            async for raw in r.aiter_raw():
                reads.append((time.perf_counter(), raw))
    text = b"".join(raw for _, raw in reads)
    events = [e for e in text.split(b"\n\n") if e.startswith(b"data: ")]
    # Fewer events than tokens: a token ending inside a UTF-8 character waits for the next.
    assert events[-1] == b"data: [DONE]" and len(events) >= 12, len(events)
    with_data = [t for t, raw in reads if b"data: " in raw]
    assert len(with_data) >= len(events) // 2, f"{len(events)} events came in only {len(with_data)} reads"
    assert with_data[-1] - with_data[0] > 0


async def metrics_of(http: httpx.AsyncClient, session: str) -> tuple[str, dict]:
    r = await http.get("/metrics", headers={"x-session-id": session})
    assert r.status_code == 200
    return r.headers[REPLICA], samples(r.text)


async def test_disconnect_frees_the_replicas_blocks(cluster: Cluster) -> None:
    session = "disconnect-test"
    async with httpx.AsyncClient(base_url=cluster.base_url, timeout=60) as http:
        async with http.stream("POST", "/v1/completions", json=LONG, headers={"x-session-id": session}) as r:
            assert r.status_code == 200
            replica = r.headers[REPLICA]
            lines = 0
            async for line in r.aiter_lines():  # (leaving this loop closes the connection)
                lines += line.startswith("data: ")
                if lines == 3:
                    where, busy = await metrics_of(http, session)
                    break
            assert where == replica
            assert value(busy, "vllm:num_requests_running") == 1 and value(busy, "switchyard_kv_blocks_used") > 0
            left = time.perf_counter()
        # The client has closed the stream; 450 tokens would take seconds more to generate.
        with trio.fail_after(10):
            while True:
                _, after = await metrics_of(http, session)
                if value(after, "switchyard_kv_blocks_used") == 0 and value(after, "switchyard_requests_live") == 0:
                    break
                await trio.sleep(0.02)
        freed_in = time.perf_counter() - left
        assert value(after, "switchyard_http_requests_total", route="/v1/completions", status="499") >= 1
        print(f"\nreplica {replica}: blocks freed {freed_in * 1000:.0f} ms after the client left")
