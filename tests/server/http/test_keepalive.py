"""Early answers on a keep-alive connection never leave it hanging.

A response sent before the request body is read (a 401, a shed 429, Azure's 400 and 404, a
413, an unknown route) must leave the connection usable, or close it cleanly: the answer
reaches the client, and the next request on the same pooled connection is served. Each path
runs ROUNDS rounds of "a good request, then the early answer" on one httpx keep-alive pool
with a short timeout (a hang shows as a timeout), with bodies of several sizes. Before the fix
(api/body_drain.py) the request after an early answer with a large body waited forever.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import trio

import api.http.app
from runtime.config import RuntimeConfig
from tests.support.fakes import fake_runtime
from tests.support.servers import start_runtime_server

ROUNDS = 200  # per path; the body sizes take turns
SIZES = (300, 64 * 1024, 1024 * 1024)
KEY = "sk-keepalive-test"
AZURE = "2024-05-01-preview"
TIMEOUT = 2.0  # seconds: far above a served round here, far below a hang

# path: (method + URL, headers, expected status, the body's error shape)
PATHS = {
    "401 no key": ("/v1/chat/completions", {}, 401, "openai"),
    "429 shed": ("/v1/chat/completions", {"Authorization": f"Bearer {KEY}"}, 429, "openai"),
    "azure 400 api-version=banana": ("/chat/completions?api-version=banana", {"Authorization": f"Bearer {KEY}"}, 400, "azure"),
    "azure 400 no api-version": ("/chat/completions", {"Authorization": f"Bearer {KEY}"}, 400, "azure"),
    "azure 404 route": (f"/images/embeddings?api-version={AZURE}", {"Authorization": f"Bearer {KEY}"}, 404, "azure"),
    "404 unknown route": ("/v1/no/such/route", {"Authorization": f"Bearer {KEY}"}, 404, "openai"),
}
SMALL_LIMIT = 4096  # the 413 server's body limit: every size below is over it
TOO_LARGE = ("/v1/chat/completions", {"Authorization": f"Bearer {KEY}"}, 413, "openai")
TOO_LARGE_SIZES = (SMALL_LIMIT + 300, 64 * 1024, 1024 * 1024)


def chat_body(size: int) -> bytes:
    """A chat request of about `size` bytes."""
    head = b'{"messages": [{"role": "user", "content": "'
    tail = b'"}], "max_tokens": 2}'
    return head + b"x" * max(0, size - len(head) - len(tail)) + tail


async def rounds(base_url: str, path: tuple, sizes: tuple[int, ...]) -> Counter:
    """Outcomes of ROUNDS rounds on one keep-alive pool: "ok", or what went wrong."""
    url, headers, status, shape = path
    outcomes: Counter = Counter()
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    good = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=base_url, timeout=TIMEOUT, limits=limits) as http:
        for i in range(ROUNDS):
            try:
                r = await http.get("/v1/models", headers=good)  # the good request before
                assert r.status_code == 200, r.text
                body = chat_body(sizes[i % len(sizes)])
                r = await http.post(url, content=body, headers={**headers, "Content-Type": "application/json"})
                outcomes[_judge(r, status, shape)] += 1
            except httpx.TimeoutException:
                outcomes["hung"] += 1
            except httpx.HTTPError as exc:
                outcomes[type(exc).__name__] += 1
        try:  # the request after the last early answer
            r = await http.get("/v1/models", headers=good)
            if r.status_code != 200:
                outcomes[f"next request: {r.status_code}"] += 1
        except httpx.TimeoutException:
            outcomes["hung"] += 1
    return outcomes


def _judge(r: httpx.Response, status: int, shape: str) -> str:
    if r.status_code != status:
        return f"status {r.status_code}"
    body = json.loads(r.content)
    ok = body.get("status") == status if shape == "azure" else isinstance(body.get("error"), dict)
    return "ok" if ok else "shape"


@asynccontextmanager
async def keyed_server(model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> AsyncIterator[object]:
    monkeypatch.setenv("SWITCHYARD_API_KEYS", KEY)
    monkeypatch.setenv("SWITCHYARD_STATE_DIR", str(tmp_path))
    for name in ("SWITCHYARD_RATE_LIMIT_RPM", "SWITCHYARD_RATE_LIMIT_TPM"):
        monkeypatch.delenv(name, raising=False)
    config = RuntimeConfig(served_name="fake", port=0, max_pending=1, drain_timeout=2.0)
    runtime = fake_runtime(model_dir, config)
    async with trio.open_nursery() as nursery:
        srv = await start_runtime_server(nursery, runtime)
        try:
            yield srv
        finally:
            runtime.runner.release.set()
            srv.stop.set()


async def hold_the_only_slot(nursery: trio.Nursery, srv: object) -> None:
    """Fill the server (max_pending=1) with one request the device holds, so it sheds."""
    runtime = srv.runtime  # type: ignore[attr-defined]
    runtime.runner.release.clear()

    async def held() -> None:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as http:  # type: ignore[attr-defined]
            await http.post("/v1/completions", json={"prompt": "hold", "max_tokens": 2}, headers={"Authorization": f"Bearer {KEY}"})

    nursery.start_soon(held)
    with trio.fail_after(10):
        while len(runtime.requests) < 1:
            await trio.sleep(0.01)


async def test_early_answers_keep_the_connection(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    results: dict[str, Counter] = {}
    async with keyed_server(tiny_model_dir, monkeypatch, tmp_path / "a") as srv, trio.open_nursery() as nursery:
        for name, path in PATHS.items():
            if name.startswith("429"):
                await hold_the_only_slot(nursery, srv)
            results[name] = await rounds(srv.base_url, path, SIZES)  # type: ignore[attr-defined]
            srv.runtime.runner.release.set()  # type: ignore[attr-defined]
    monkeypatch.setattr(api.http.app, "MAX_BODY_BYTES", SMALL_LIMIT)
    async with keyed_server(tiny_model_dir, monkeypatch, tmp_path / "b") as srv:
        results["413 body over the limit"] = await rounds(srv.base_url, TOO_LARGE, TOO_LARGE_SIZES)  # type: ignore[attr-defined]
    bad = {name: dict(counts) for name, counts in results.items() if counts != Counter(ok=ROUNDS)}
    assert not bad, f"out of {ROUNDS} rounds per path: {bad}"
