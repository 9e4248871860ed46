"""The end-to-end tier's server: the embedded default model (SmolLM2-135M-Instruct), real weights.

`default_server` is the whole stack on it in float32 with a 0.25 GiB KV cache
(tests/support/servers.py `default_config()`); modules that need another dtype or batch
shape start their own from `default_config(**overrides)`. `served_default` is the model as
`switchyard serve` runs it: the flags' defaults (bf16, the shipped blocks, the row-invariant
kernels), n-gram drafting named (`serve_config()`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio

from tests.support.servers import Server, default_config, serve_config, start_server


@pytest.fixture
async def default_server() -> AsyncIterator[Server]:
    async with trio.open_nursery() as nursery:
        srv = await start_server(nursery, default_config())
        yield srv
        srv.stop.set()


@pytest.fixture
async def served_default() -> AsyncIterator[Server]:
    async with trio.open_nursery() as nursery:
        srv = await start_server(nursery, serve_config())
        yield srv
        srv.stop.set()
