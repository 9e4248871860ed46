"""Servers for the platform tests: the whole stack (tests/conftest.py `start_server`) with the
platform settings (API keys, limits, state dir) given through the environment, as the CLI's
fallback reads them. The state dir is always the test's own, never the user's model store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import trio

from tests.conftest import Server, start_server, tiny_config

KEY = "sk-test-platform-0123456789"
OTHER_KEY = "sk-test-platform-other-key"


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


def client(server: Server, key: str | None = None, timeout: float = 60) -> httpx.AsyncClient:
    headers = auth(key) if key else {}
    return httpx.AsyncClient(base_url=server.base_url, headers=headers, timeout=timeout)
