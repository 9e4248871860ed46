"""The guard Ray's HTTP proxy runs on the direct topology (api/cluster/proxy_guard.py), without
Ray: an app standing in for the proxy's ends a response early, as the proxy's does when the
replica behind it dies, and the client must still get a readable end."""

from __future__ import annotations

import json
from typing import Any

import trio

from api.cluster.proxy_guard import ReplicaFailureGuard

SCOPE = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
SSE_START = {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}


async def run(app: Any, client_leaves: bool = False) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"} if client_leaves else {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await ReplicaFailureGuard(app)(dict(SCOPE), receive, send)
    return sent


async def test_a_stream_cut_mid_way_ends_with_an_error_event_and_done() -> None:
    async def proxy(scope: Any, receive: Any, send: Any) -> None:
        await send(SSE_START)
        await send({"type": "http.response.body", "body": b'data: {"x": 1}\n\n', "more_body": True})
        # the replica died: the proxy returns with the body unfinished

    sent = await run(proxy)
    tail = sent[-1]["body"].decode()
    assert '"code":"replica_failed"' in tail.replace(" ", "") and tail.endswith("data: [DONE]\n\n"), tail
    assert not sent[-1].get("more_body")


async def test_no_response_at_all_becomes_a_503_in_the_apis_shape() -> None:
    async def proxy(scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError("ActorDiedError")

    sent = await run(proxy)
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 503
    error = json.loads(b"".join(m.get("body", b"") for m in sent[1:]))["error"]
    assert error["code"] == "replica_failed"


async def test_finished_responses_and_departed_clients_are_left_alone() -> None:
    async def complete(scope: Any, receive: Any, send: Any) -> None:
        await send(SSE_START)
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    assert len(await run(complete)) == 2

    async def client_gone(scope: Any, receive: Any, send: Any) -> None:
        await send(SSE_START)
        await receive()  # the proxy learns the client left and stops
        await trio.sleep(0)

    assert len(await run(client_gone, client_leaves=True)) == 1
