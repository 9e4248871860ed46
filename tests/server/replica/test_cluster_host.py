"""api/cluster/host.py without Ray: the single-node app on a trio thread, driven from asyncio,
as a serve-ray replica drives it. Messages stream as sent; leaving early aborts the request
and frees its KV blocks; after stop, a request fails fast instead of waiting forever."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

import pytest

from api.cluster.host import HostDead, TrioHost
from api.http.platform.config import PlatformConfig
from tests.support.servers import host_request, tiny_config


def test_stream_cancel_and_stop(tiny_model_dir: Path, tmp_path: Path) -> None:
    async def scenario() -> None:
        # As a replica's process starts it: what start-up left alive frozen out of garbage
        # collection once the models are up (runtime/memory.py); undone after, for the suite.
        host = TrioHost([tiny_config(tiny_model_dir)], PlatformConfig(state_dir=str(tmp_path)), freeze_heap=True)
        await host.wait_ready()
        assert gc.get_freeze_count() > 100_000
        stream = {"model": "tiny", "prompt": "hi", "max_tokens": 24, "temperature": 0, "stream": True, "ignore_eos": True}
        batches = [b async for b in host.stream(host_request("/v1/completions", stream))]
        messages = [m for batch in batches for m in batch]
        assert messages[0]["type"] == "http.response.start" and messages[0]["status"] == 200
        bodies = [m.get("body", b"") for m in messages[1:]]
        assert sum(b.startswith(b"data: {") for b in bodies) >= 6  # one message per event, not one blob
        assert any(b"[DONE]" in b for b in bodies)
        assert len(batches) > 2  # tokens cross as they come, not all at the end

        long = {**stream, "max_tokens": 400}
        gen = host.stream(host_request("/v1/completions", long))
        async for batch in gen:
            if any(m.get("body", b"").startswith(b"data: {") for m in batch):
                break
        await gen.aclose()  # what a cancelled Ray call does to the replica's generator

        def idle() -> bool:
            stats = next(iter(host.models)).statistics()
            return stats["live_requests"] == 0 and stats["kv_blocks_used"] == 0

        for _ in range(200):
            if await host.call(idle):
                break
            await asyncio.sleep(0.01)
        assert await host.call(idle)

        bad = [m async for b in host.stream(host_request("/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 0})) for m in b]
        assert bad[0]["status"] == 400  # the app's own error shape, not a bridge error

        await asyncio.to_thread(host.stop)
        with pytest.raises(HostDead):
            async for _ in host.stream(host_request("/v1/completions", stream)):
                pass

    try:
        asyncio.run(scenario())
    finally:
        gc.unfreeze()


def test_drain_ends_live_streams_cleanly_and_refuses_new_requests(tiny_model_dir: Path, tmp_path: Path) -> None:
    """What a replica does once the driver announces the stop (api/cluster/replica.py)."""

    async def scenario() -> None:
        host = TrioHost([tiny_config(tiny_model_dir)], PlatformConfig(state_dir=str(tmp_path)))
        await host.wait_ready()
        long = {"model": "tiny", "prompt": "hi", "max_tokens": 400, "stream": True, "ignore_eos": True}
        gen = host.stream(host_request("/v1/completions", long))
        messages = []
        async for batch in gen:
            messages += batch
            if any(m.get("body", b"").startswith(b"data: {") for m in batch):
                break
        await host.drain(0)  # no grace: the stream in flight is aborted now
        messages += [m async for batch in gen for m in batch]
        body = b"".join(m.get("body", b"") for m in messages[1:])
        assert body.endswith(b"data: [DONE]\n\n") and b'"error"' in body, body[-300:]
        refused = [m async for b in host.stream(host_request("/v1/completions", {**long, "stream": False})) for m in b]
        assert refused[0]["status"] == 503
        await asyncio.to_thread(host.stop, 0)

    asyncio.run(scenario())
