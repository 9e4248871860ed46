"""Fixtures of the real-client layer: the live server on the tiny model with room for a tools
block, and the `openai` client on it. Helpers (schemas, scripts, asyncio clients, the switches
that keep every client off the internet) are in tests/support/clients.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import openai
import pytest
import trio

import tests.support.clients  # noqa: F401 - sets the no-internet switches before any client is imported
from tests.support.servers import Server, start_server, tiny_config


@pytest.fixture
async def forced_server(long_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Server]:
    monkeypatch.setenv("SWITCHYARD_STATE_DIR", str(tmp_path))
    async with trio.open_nursery() as nursery:
        server = await start_server(nursery, tiny_config(long_model_dir, max_num_batched_tokens=256))
        yield server
        server.stop.set()


@pytest.fixture
def client(forced_server: Server) -> Iterator[openai.OpenAI]:
    # Closed after each test: an idle keep-alive connection would hold up the server's shutdown.
    with openai.OpenAI(base_url=forced_server.openai_url, api_key="unused", max_retries=0, timeout=120) as c:
        yield c
