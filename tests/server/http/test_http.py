"""Raw HTTP against the real app: SSE framing, malformed bodies, disconnects, health."""

from __future__ import annotations

import json

import httpx

from tests.support.servers import Server
from tests.support.waiting import wait_idle


async def test_sse_framing_and_done(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        body = {"prompt": "The", "max_tokens": 5, "temperature": 0, "stream": True, "ignore_eos": True}
        async with http.stream("POST", "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            raw = (await resp.aread()).decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    payloads = [json.loads(e[6:]) for e in events[:-1]]
    assert payloads[-1]["choices"][0]["finish_reason"] == "length"


async def test_malformed_json_and_wrong_method(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        r = await http.post("/v1/chat/completions", content=b"{not json")
        assert r.status_code == 400
        assert r.json()["error"]["type"] == "invalid_request_error"
        r = await http.get("/v1/chat/completions")
        assert r.status_code == 405
        r = await http.post("/v1/completions", json={"max_tokens": 3})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


async def test_client_disconnect_frees_slot_and_blocks(server: Server) -> None:
    """A streaming client that leaves mid-stream: its request and KV blocks are gone quickly."""
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        body = {"prompt": "The quick", "max_tokens": 400, "temperature": 0, "stream": True, "ignore_eos": True}
        async with http.stream("POST", "/v1/completions", json=body) as resp:
            seen = 0
            async for line in resp.aiter_lines():
                if line.startswith("data: "):
                    seen += 1
                if seen == 3:
                    break
            # Still streaming (3 of 400 tokens): the request is live and holds KV blocks.
            stats = server.runtime.statistics()  # type: ignore[attr-defined]
            assert stats["live_requests"] == 1 and stats["kv_blocks_used"] > 0, stats
    # Socket closed: the handler is cancelled, the request is aborted, its blocks freed.
    await wait_idle(server.runtime, timeout=5.0)
    # And the server still serves.
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        r = await http.post("/v1/completions", json={"prompt": "ok", "max_tokens": 2})
        assert r.status_code == 200


async def test_health_and_models(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.base_url) as http:
        r = await http.get("/health")
        assert r.status_code == 200 and r.json()["status"] == "ok"
        r = await http.get("/v1/models/tiny")
        assert r.json()["id"] == "tiny"


def test_no_response_timeout() -> None:
    """Quart's default RESPONSE_TIMEOUT (60 s) would end any longer stream with a clean EOF, as if
    it were done."""
    from api.http.app import create_app
    from runtime.registry import ModelRegistry

    app = create_app(ModelRegistry([]))
    assert app.config["RESPONSE_TIMEOUT"] is None
