"""Helpers for the production-behaviour tests: servers on custom runtimes, idleness checks.

`start_runtime_server` hosts any Runtime (usually `tests.fakes.fake_runtime`) through the real
`serve_runtime`, on 127.0.0.1:0, in the test's nursery. `assert_idle` is the "nothing leaked"
check every scenario ends with: no live request, no scheduler queue, no KV block in use, no
message sitting in any actor's inbox.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import trio

from runtime.config import RuntimeConfig
from tests.conftest import Server


async def start_runtime_server(nursery: trio.Nursery, runtime: Any, config: RuntimeConfig | None = None) -> Server:
    from api.process.server import serve_runtime

    config = config or runtime.config
    stop = trio.Event()
    binds = await nursery.start(serve_runtime, config, lambda cfg: runtime, stop.wait)
    return Server(base_url=binds[0], runtime=runtime, config=config, stop=stop)


def leaks(runtime: Any) -> dict[str, int]:
    """Everything that must be zero once no request is in flight (empty dict: nothing leaked)."""
    stats = runtime.statistics()
    counts = {
        "live_requests": stats["live_requests"],
        "scheduler_requests": stats["requests"],
        "waiting": stats["waiting"],
        "running": stats["running"],
        "kv_blocks_used": stats["kv_blocks_used"],
        "scheduler_inbox": stats["inbox"],
        "tokenizer_inbox": runtime.tokenizer_actor.inbox.statistics().current_buffer_used,
        "detokenizer_inbox": runtime.detokenizer.inbox.statistics().current_buffer_used,
        "detokenizer_states": len(runtime.detokenizer.requests),
        "executor_inbox": runtime.executor.plans.statistics().current_buffer_used,
        "pending_tokens": runtime.pending_tokens(),
        "requests_dict": len(runtime.requests),
    }
    return {k: v for k, v in counts.items() if v}


async def wait_idle(runtime: Any, timeout: float = 10.0) -> None:
    """Wait (bounded) until nothing is in flight; fail naming what is left."""
    with trio.move_on_after(timeout):
        while leaks(runtime):
            await trio.sleep(0.02)
    assert not leaks(runtime), f"left over after {timeout}s: {leaks(runtime)}"


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
