"""The embeddings tier's server: the tiny chat model and the embedded all-MiniLM-L6-v2 side by
side (the shared `client` fixture, tests/server/conftest.py, drives it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from runtime.config import RuntimeConfig
from tests.support.servers import Server, start_server, tiny_config


@pytest.fixture
async def server(tiny_model_dir: Path) -> AsyncIterator[Server]:
    embed = RuntimeConfig(model=None, task="embeddings", dtype="float32", num_threads=1)
    async with trio.open_nursery() as nursery:
        srv = await start_server(nursery, tiny_config(tiny_model_dir), embed)
        yield srv
        srv.stop.set()
