"""Talking to a server under test over HTTP: request shortcuts, SSE parsing, /metrics samples."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families


async def complete(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    """POST /v1/completions (model "tiny"), expecting 200; the parsed body."""
    r = await http.post("/v1/completions", json={"model": "tiny", **body})
    assert r.status_code == 200, r.text
    return r.json()


async def chat(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    r = await http.post("/v1/chat/completions", json={"model": "tiny", **body})
    assert r.status_code == 200, r.text
    return r.json()


async def stream_events(http: httpx.AsyncClient, path: str, **body: Any) -> list[dict[str, Any]]:
    """An SSE response's JSON payloads (the trailing [DONE] checked and dropped)."""
    async with http.stream("POST", path, json={"model": "tiny", "stream": True, **body}) as resp:
        assert resp.status_code == 200, (await resp.aread()).decode()
        raw = (await resp.aread()).decode()
    events = [e for e in raw.split("\n\n") if e]
    assert events[-1] == "data: [DONE]", events[-3:]
    return [json.loads(e[len("data: ") :]) for e in events[:-1]]


def sse_payloads(raw: str) -> list[str]:
    return [event[6:] for event in raw.split("\n\n") if event.startswith("data: ")]


async def serves_normally(base_url: str, check: Callable[[dict], bool] | None = None, headers: dict[str, str] | None = None) -> None:
    """One ordinary completion succeeds: the server is alive and well (`headers`: e.g. a key)."""
    async with httpx.AsyncClient(base_url=base_url, timeout=30, headers=headers) as http:
        r = await http.post("/v1/completions", json={"prompt": "The quick", "max_tokens": 4, "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["usage"]["completion_tokens"] == 4
        if check is not None:
            assert check(body)
        r = await http.get("/health")
        assert r.status_code == 200, r.text


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """A /metrics page's samples, by (name, labels)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(metrics: dict, name: str, **labels: str) -> float:
    """Sum of every sample called `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, lbls), v in metrics.items() if n == name and want <= lbls)
