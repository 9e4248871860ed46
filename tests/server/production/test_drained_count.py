"""SIGTERM's `drained` log line counts the requests the drain deadline aborted.

It said `aborted: 0` when the deadline had aborted every stream: the count was read after the
drain had already aborted them, when none was live any more. The drain now returns what it
aborted. `serve_runtime` in-process on the fake runner, stopped as SIGTERM stops it.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import trio
from structlog.testing import capture_logs

from runtime.config import RuntimeConfig
from tests.support.fakes import fake_runtime
from tests.support.servers import start_runtime_server


async def test_the_drained_line_counts_the_streams_the_deadline_aborted(tiny_model_dir: Path) -> None:
    config = RuntimeConfig(served_name="fake", port=0, drain_timeout=0.3)
    runtime = fake_runtime(tiny_model_dir, config, step_delay=0.01)
    body = {"prompt": "The quick", "max_tokens": 200, "ignore_eos": True, "stream": True}
    ended: list[bytes] = []
    with capture_logs() as logs, trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            srv = await start_runtime_server(nursery, runtime)

            async def stream(http: httpx.AsyncClient) -> None:
                async with http.stream("POST", "/v1/completions", json=body) as resp:
                    ended.append(await resp.aread())

            async with httpx.AsyncClient(base_url=srv.base_url, timeout=30) as http, trio.open_nursery() as clients:
                for _ in range(5):
                    clients.start_soon(stream, http)
                while len(runtime.requests) < 5:
                    await trio.sleep(0.01)
                srv.stop.set()  # what SIGTERM does
    assert len(ended) == 5 and all(b"shutting down" in raw for raw in ended)  # each stream got its error event
    [shutting_down] = [line for line in logs if line["event"] == "shutting_down"]
    [drained] = [line for line in logs if line["event"] == "drained"]
    assert shutting_down["live_requests"] == 5
    assert drained["aborted"] == 5, drained
