"""Graceful shutdown: SIGTERM stops admission, in-flight requests finish within the drain
deadline, the rest are aborted with a clean error, the actors stop, and the process exits 0.

Two tests run the real `python -m api.process.main` in a subprocess and signal it (the drain
across an engine process and a second front end is tests/server/production/test_api_servers.py's);
one runs `serve_runtime` in-process on the fake runner to show what happens past the deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import trio

from runtime.config import RuntimeConfig
from tests.support import ROOT
from tests.support.fakes import fake_runtime
from tests.support.http import sse_payloads
from tests.support.servers import free_port, start_runtime_server

NUM_STREAMS = 16
STREAM_TOKENS = 400  # the tiny model's context is 512


class ServerProcess:
    def __init__(self, model_dir: Path, drain_timeout: float, log_path: Path, *flags: str) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        args = [
            sys.executable, "-m", "api.process.main", "serve", "--model", str(model_dir), "--port", str(self.port),
            "--dtype", "float32", "--num-kv-blocks", "512", "--block-size", "4", "--num-threads", "1",
            "--max-num-batched-tokens", "64", "--drain-timeout", str(drain_timeout), "--no-embeddings", "--no-compile", *flags,
        ]  # fmt: skip
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen(args, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    async def wait_ready(self, timeout: float = 90) -> None:
        with trio.fail_after(timeout):
            async with httpx.AsyncClient(base_url=self.base_url, timeout=2) as http:
                while True:
                    assert self.proc.poll() is None, self.log_path.read_text()[-3000:]
                    try:
                        if (await http.get("/health")).status_code == 200:
                            return
                    except httpx.TransportError:
                        pass
                    await trio.sleep(0.2)

    async def wait_exit(self, timeout: float) -> int:
        with trio.fail_after(timeout):
            while (rc := self.proc.poll()) is None:
                await trio.sleep(0.05)
        return rc

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()

    def log_lines(self) -> list[dict]:
        out = []
        for line in self.log_path.read_text().splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
        return out


async def run_streams(base_url: str, max_tokens: int, started: trio.Semaphore | list, results: list) -> None:  # type: ignore[type-arg]
    async def one(http: httpx.AsyncClient) -> None:
        body = {"prompt": "The quick", "max_tokens": max_tokens, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        async with http.stream("POST", "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            raw = ""
            async for chunk in resp.aiter_text():
                if not raw:
                    started.append(1)  # type: ignore[union-attr]
                raw += chunk
        results.append(sse_payloads(raw))

    limits = httpx.Limits(max_connections=NUM_STREAMS + 4)
    async with httpx.AsyncClient(base_url=base_url, timeout=120, limits=limits) as http:
        async with trio.open_nursery() as nursery:
            for _ in range(NUM_STREAMS):
                nursery.start_soon(one, http)


async def test_sigterm_lets_16_streams_finish_and_exits_0(tiny_model_dir, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server = ServerProcess(tiny_model_dir, 30, tmp_path / "server.log")
    try:
        await server.wait_ready()
        children = psutil.Process(server.proc.pid).children()
        assert not children, children
        started: list[int] = []
        results: list[list[str]] = []
        async with trio.open_nursery() as nursery:
            # Streams long enough (~1 s on the tiny model) that the drain cannot end before the
            # late request below: with 160 tokens a fast CPU drained and exited within the 0.2 s
            # this test used to wait, and the late request found no listener.
            nursery.start_soon(run_streams, server.base_url, STREAM_TOKENS, started, results)
            with trio.fail_after(60):
                while len(started) < NUM_STREAMS:
                    await trio.sleep(0.01)
            signalled = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            # Admission is closed at once: a new request is refused with a clean 503.
            with trio.fail_after(10):
                while '"event": "shutting_down"' not in server.log_path.read_text():  # raw: a line may be half written
                    await trio.sleep(0.005)
            async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as http:
                r = await http.post("/v1/completions", json={"prompt": "late", "max_tokens": 2})
            assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable", r.text
        # Every in-flight stream ran to its end, within the drain deadline.
        assert len(results) == NUM_STREAMS
        for events in results:
            assert events[-1] == "[DONE]", events[-3:]
            assert json.loads(events[-2])["usage"]["completion_tokens"] == STREAM_TOKENS
            assert not any('"error"' in e for e in events)
        assert await server.wait_exit(timeout=40) == 0
        assert time.monotonic() - signalled < 30
        events = [line["event"] for line in server.log_lines()]
        order = [e for e in events if e in ("signal_received", "shutting_down", "drained", "stopped")]
        assert order == ["signal_received", "shutting_down", "drained", "stopped"], order
        assert next(line for line in server.log_lines() if line["event"] == "drained")["aborted"] == 0
        # Before it listened, what start-up left alive was frozen out of garbage collection
        # (runtime/memory.py): torch's and transformers' objects, far more than a hundred thousand.
        frozen = [line for line in server.log_lines() if line["event"] == "listening" or line.get("reason") == "startup"]
        assert [line["event"] for line in frozen] == ["heap_frozen", "listening"] and frozen[0]["objects"] > 100_000, frozen
    finally:
        server.kill()


async def test_a_second_sigterm_cuts_the_drain_short(tiny_model_dir, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server = ServerProcess(tiny_model_dir, drain_timeout=300, log_path=tmp_path / "server.log")
    try:
        await server.wait_ready()
        started: list[int] = []
        results: list[list[str]] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_streams, server.base_url, 300, started, results)
            with trio.fail_after(60):
                while len(started) < NUM_STREAMS:
                    await trio.sleep(0.01)
            server.proc.send_signal(signal.SIGTERM)
            await trio.sleep(0.3)
            server.proc.send_signal(signal.SIGTERM)
        # Nobody waited for the 300 s deadline: the streams ended with a clean error event.
        assert len(results) == NUM_STREAMS
        aborted = [events for events in results if '"error"' in events[-2]]
        assert aborted, "no stream was cut short"
        for events in aborted:
            assert events[-1] == "[DONE]"
            assert "shutting down" in json.loads(events[-2])["error"]["message"]
        assert await server.wait_exit(timeout=30) == 0
        assert any(line["event"] == "forced_shutdown" for line in server.log_lines())
    finally:
        server.kill()


async def test_past_the_drain_deadline_requests_get_a_clean_error(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    config = RuntimeConfig(served_name="fake", port=0, drain_timeout=0.5)
    runtime = fake_runtime(tiny_model_dir, config, step_delay=0.01)
    streamed: list[list[str]] = []
    collected: list[httpx.Response] = []
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            srv = await start_runtime_server(nursery, runtime)
            body = {"prompt": "The quick", "max_tokens": 200, "ignore_eos": True}

            async def stream(http: httpx.AsyncClient) -> None:
                async with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
                    streamed.append(sse_payloads((await resp.aread()).decode()))

            async def post(http: httpx.AsyncClient) -> None:
                collected.append(await http.post("/v1/completions", json=body))

            async with httpx.AsyncClient(base_url=srv.base_url, timeout=30) as http:
                async with trio.open_nursery() as clients:
                    for _ in range(4):
                        clients.start_soon(stream, http)
                        clients.start_soon(post, http)
                    while len(runtime.requests) < 8:
                        await trio.sleep(0.01)
                    srv.stop.set()  # what SIGTERM does
        # serve_runtime has returned: the runtime is stopped and the device thread closed.
    assert runtime.runner.closed and not runtime.executor.thread.is_alive
    assert runtime.requests == {}
    assert len(streamed) == 4 and len(collected) == 4
    for events in streamed:
        assert events[-1] == "[DONE]"
        assert "shutting down" in json.loads(events[-2])["error"]["message"]
    for r in collected:
        assert r.status_code == 503 and "shutting down" in r.json()["error"]["message"]
