"""The server tier's fixtures: the real app on a loopback socket, in the test's own trio loop.

`server` runs the whole stack (tests/support/servers.py `start_server`) on the tiny model, so
tests talk to it over a real socket and can still look inside the engine afterwards; `client`
is the official openai client on it, `http` a plain httpx client. A folder's conftest (e.g.
embeddings/) or a module may start its own `server`; `client` and `http` then follow it.
`long_model_dir` is the tiny model with room for a tools block in its context.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import openai
import pytest
import trio

from tests.support.servers import Server, start_server, tiny_config


@pytest.fixture
async def server(tiny_model_dir: Path) -> AsyncIterator[Server]:
    async with trio.open_nursery() as nursery:
        srv = await start_server(nursery, tiny_config(tiny_model_dir))
        yield srv
        srv.stop.set()


@pytest.fixture
def client(server: Server) -> Iterator[openai.OpenAI]:
    # Closed after each test: an idle keep-alive connection would hold up the server's
    # graceful shutdown at teardown.
    with openai.OpenAI(base_url=server.openai_url, api_key="unused", max_retries=0, timeout=60) as c:
        yield c


@pytest.fixture(scope="session")
def long_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with room for a tools block (its vocabulary is close to bytes)."""
    from tests.support.tiny_model import build_tiny_decoder

    return build_tiny_decoder(tmp_path_factory.mktemp("tiny-long"), "llama", perturb_norms=False, max_position_embeddings=2048)


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random BERT embedding model (tests/support/tiny_bert.py)."""
    from tests.support.tiny_bert import build_tiny_bert

    return build_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture
async def http(server: Server) -> AsyncIterator[httpx.AsyncClient]:
    """A plain httpx client on `server`."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
        yield client
