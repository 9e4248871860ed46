"""Servers for tests: the whole stack on a loopback socket, in the test's own trio loop.

`start_server` runs everything for real — the engine's actors, the torch runner on its
dedicated thread, Quart-Trio on Hypercorn bound to 127.0.0.1:0 — so tests talk to it over a
socket and can still look inside the engine afterwards. `start_runtime_server` hosts any
engine (usually `fakes.fake_runtime`) the same way. `platform_server` gives the platform
settings (API keys, limits, state dir) through the environment, as the CLI's fallback reads
them; its state dir is always the test's own, never the user's model store.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from runtime.config import RuntimeConfig
from tests.support.device import suite_device


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


def split_engine() -> bool:
    """SWITCHYARD_TEST_ENGINE_PROCESS=1: every test server runs its model's engine in a process
    of its own (--engine-process), so the server tier can be run against the split server."""
    return os.environ.get("SWITCHYARD_TEST_ENGINE_PROCESS") == "1"


def tiny_config(model_dir: Path, **overrides: object) -> RuntimeConfig:
    settings: dict[str, object] = dict(
        model=str(model_dir),
        device=suite_device(),  # the CPU unless SWITCHYARD_TEST_DEVICE says otherwise
        served_name="tiny",
        port=0,
        dtype="float32",
        num_kv_blocks=256,
        block_size=4,
        max_num_batched_tokens=32,
        num_threads=1,
        drain_timeout=5.0,
        compile=False,  # the CPU's default compiles a decode graph in the background: tests that want it say so
        engine_process=split_engine(),
    )
    settings.update(overrides)
    return RuntimeConfig(**settings)  # type: ignore[arg-type]


def serve_config(**overrides: Any) -> RuntimeConfig:
    """What `switchyard serve` runs on the embedded model, the flags' defaults, with a smaller KV
    cache and n-gram drafting named (so a test can force drafting on and off: spec.DraftSwitch)."""
    return RuntimeConfig(**{"model": None, "port": 0, "kv_cache_gib": 0.25, "drain_timeout": 5.0, "spec_decoding": "ngram", "engine_process": split_engine(), **overrides})


def default_config(**overrides: Any) -> RuntimeConfig:
    """The embedded default model (SmolLM2-135M-Instruct), float32 unless overridden."""
    settings: dict[str, Any] = dict(
        model=None, device=suite_device(), port=0, dtype="float32", kv_cache_gib=0.25, max_num_batched_tokens=64, drain_timeout=5.0, compile=False, engine_process=split_engine()
    )
    settings.update(overrides)
    return RuntimeConfig(**settings)


async def start_server(nursery: trio.Nursery, config: RuntimeConfig, *extra: RuntimeConfig, platform: Any = None) -> Server:
    from actors.build import build_engine
    from api.process.server import serve_runtime

    runtimes: list[object] = []
    stop = trio.Event()

    def factory(cfg: RuntimeConfig) -> object:
        runtimes.append(build_engine(cfg))
        return runtimes[-1]

    binds = await nursery.start(partial(serve_runtime, config, factory, stop.wait, extra_models=extra, platform=platform))
    return Server(base_url=binds[0], runtime=runtimes[0], config=config, stop=stop, runtimes=runtimes)


async def start_runtime_server(nursery: trio.Nursery, runtime: Any, config: RuntimeConfig | None = None) -> Server:
    """Any engine behind the real `serve_runtime`, on 127.0.0.1:0, in the test's nursery."""
    from api.process.server import serve_runtime

    config = config or runtime.config
    stop = trio.Event()
    binds = await nursery.start(serve_runtime, config, lambda cfg: runtime, stop.wait)
    return Server(base_url=binds[0], runtime=runtime, config=config, stop=stop)


KEY = "sk-test-platform-0123456789"
OTHER_KEY = "sk-test-platform-other-key"
# A Databricks serving endpoint over two served models with a 70/30 traffic split.
AB = {
    "name": "ab-test",
    "config": {
        "served_entities": [{"name": "a", "entity_name": "tiny-a"}, {"name": "b", "entity_name": "tiny-b"}],
        "traffic_config": {"routes": [{"served_model_name": "a", "traffic_percentage": 70}, {"served_model_name": "b", "traffic_percentage": 30}]},
    },
}


@asynccontextmanager
async def platform_server(
    model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    state_dir: Path,
    *,
    names: tuple[str, ...] = ("tiny",),
    keys: tuple[str, ...] = (),
    rpm: int | None = None,
    tpm: int | None = None,
) -> AsyncIterator[Server]:
    monkeypatch.setenv("SWITCHYARD_STATE_DIR", str(state_dir))
    monkeypatch.setenv("SWITCHYARD_API_KEYS", ",".join(keys))
    for name, value in (("SWITCHYARD_RATE_LIMIT_RPM", rpm), ("SWITCHYARD_RATE_LIMIT_TPM", tpm)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, str(value))
    configs = [tiny_config(model_dir, served_name=name) for name in names]
    async with trio.open_nursery() as nursery:
        server = await start_server(nursery, *configs)
        try:
            yield server
        finally:
            server.stop.set()


def auth(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def platform_client(server: Server, key: str | None = None, timeout: float = 60) -> httpx.AsyncClient:
    """An httpx client on `server`, with `key` as its bearer token when given."""
    headers = auth(key) if key else {}
    return httpx.AsyncClient(base_url=server.base_url, headers=headers, timeout=timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_request(path: str, body: dict) -> Any:
    """A POST of `body` to `path` as a serve-ray replica hands it to its host (api/cluster/host.py)."""
    from api.cluster.host import HttpRequest

    scope = {
        "type": "http", "http_version": "1.1", "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
        "query_string": b"", "root_path": "", "headers": [(b"content-type", b"application/json")], "client": ("127.0.0.1", 1), "server": ("x", 80),
    }  # fmt: skip
    return HttpRequest(scope, json.dumps(body).encode())


def serve_once(config: RuntimeConfig, tmp_path: Path, path: str, body: dict[str, Any]) -> tuple[dict[str, Any], set[int]]:
    """The answer of a serve-ray replica's host (api/cluster/host.py, no Ray) to one request,
    and the KV block hashes its prefix cache then holds."""
    import asyncio

    from api.cluster.host import TrioHost
    from api.http.platform.config import PlatformConfig

    def cached_hashes(host: TrioHost) -> set[int]:
        runtime = next(iter(host.models))
        return set(runtime.scheduler.core.blocks.hash_to_block)

    async def serve() -> tuple[dict[str, Any], set[int]]:
        host = TrioHost([config], PlatformConfig(state_dir=str(tmp_path / "state")))
        await host.wait_ready()
        try:
            messages = [m async for batch in host.stream(host_request(path, body)) for m in batch]
            assert messages[0]["status"] == 200, messages
            answer = json.loads(b"".join(m.get("body", b"") for m in messages[1:]))
            return answer, await host.call(cached_hashes, host)
        finally:
            await asyncio.to_thread(host.stop, 0)

    return asyncio.run(serve())
