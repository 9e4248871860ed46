"""The serve-ray cases both topologies pass (tests/cluster/test_basic_serving.py on the relay,
test_serving_direct.py on the direct one), each taking its module's `cluster` fixture: two
replicas serve, SSE crosses the hops token by token, a disconnect frees the replica's blocks.

Test functions kept here, not in a test module, so both modules import them (pytest collects
an imported test function as the importing module's own) and no test module imports another.
"""

from __future__ import annotations

import time

import httpx
import trio

from tests.support.cluster import LONG, REPLICA, Cluster
from tests.support.http import samples, value


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
