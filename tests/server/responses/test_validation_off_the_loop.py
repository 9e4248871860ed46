"""First-seen tool schemas and response formats are compiled off the event loop:
llguidance takes milliseconds to seconds on a new schema, and on the loop that
stalls every other request's stream. Each test sends a schema no earlier request used (so the
validation cache misses) and records the thread its compilation ran on."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import httpx
import pytest

import api.http.openai.common.grammars
from tests.support.servers import Server


def record_compiling_threads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    threads: list[int] = []
    compile_schema = api.http.openai.common.grammars.json_schema_grammar

    def recorded(schema: Any) -> str:
        threads.append(threading.get_ident())
        return compile_schema(schema)

    monkeypatch.setattr(api.http.openai.common.grammars, "json_schema_grammar", recorded)
    return threads


def new_schema() -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{uuid.uuid4().hex}": {"type": "string"}}}


async def test_first_seen_schemas_compile_off_the_loop(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    loop = threading.get_ident()  # the test's trio loop is the server's
    threads = record_compiling_threads(monkeypatch)
    tool = {"type": "function", "function": {"name": "f", "parameters": new_schema()}}
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        r = await http.post("/v1/chat/completions", json={**chat, "tools": [tool]})
        assert r.status_code == 200, r.text
        fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": new_schema()}}
        r = await http.post("/v1/chat/completions", json={**chat, "response_format": fmt})
        assert r.status_code == 200, r.text
        r = await http.post("/v1/responses", json={"model": "tiny", "input": "hi", "max_output_tokens": 2, "tools": [{"type": "function", "name": "g", "parameters": new_schema()}]})
        assert r.status_code == 200, r.text
        bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "no-such-type"}}}}}
        r = await http.post("/v1/chat/completions", json={**chat, "tools": [bad]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0].function.parameters", r.text
    assert len(threads) >= 4 and loop not in threads, (loop, threads)
