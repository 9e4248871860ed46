"""Shared fixtures: a tiny model on disk, and a real server on a loopback socket.

`server` runs the whole stack in the test's own trio loop — Runtime, actors, the torch runner
on its dedicated thread, Quart-Trio on Hypercorn bound to 127.0.0.1:0 — so tests talk to it
over a real socket and can still look inside the runtime afterwards.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest
import trio

from runtime.config import RuntimeConfig


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.tiny_model import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@dataclass
class Server:
    base_url: str
    runtime: object
    config: RuntimeConfig
    stop: trio.Event
    runtimes: list[object] = field(default_factory=list)  # runtime first, then the extra models

    @property
    def openai_url(self) -> str:
        return self.base_url + "/v1"


def tiny_config(model_dir: Path, **overrides: object) -> RuntimeConfig:
    settings: dict[str, object] = dict(
        model=str(model_dir),
        served_name="tiny",
        port=0,
        dtype="float32",
        num_kv_blocks=256,
        block_size=4,
        max_num_batched_tokens=32,
        num_threads=1,
        drain_timeout=5.0,
    )
    settings.update(overrides)
    return RuntimeConfig(**settings)  # type: ignore[arg-type]


async def start_server(nursery: trio.Nursery, config: RuntimeConfig, *extra: RuntimeConfig) -> Server:
    from actors.build import build_engine
    from api.process.server import serve_runtime

    runtimes: list[object] = []
    stop = trio.Event()

    def factory(cfg: RuntimeConfig) -> object:
        runtimes.append(build_engine(cfg))
        return runtimes[-1]

    binds = await nursery.start(partial(serve_runtime, config, factory, stop.wait, extra_models=extra))
    return Server(base_url=binds[0], runtime=runtimes[0], config=config, stop=stop, runtimes=runtimes)


@pytest.fixture
async def server(tiny_model_dir: Path) -> AsyncIterator[Server]:
    async with trio.open_nursery() as nursery:
        srv = await start_server(nursery, tiny_config(tiny_model_dir))
        yield srv
        srv.stop.set()
