"""Several HTTP front ends on one port (`--api-servers 2`), through the real command: both serve,
each its own requests from the one engine process; one per-key rate limit holds across them;
a serving endpoint defined through either is served by both; every scrape of /metrics, whichever
process answers it, counts every process's requests; SIGTERM drains the streams of both and
everything exits 0; a LoRA adapter named at start answers through both; the engine process
dying ends the streams with clean errors and the server exits 1; a SIGKILL to the server leaves
no process behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
import trio

from tests.support import ROOT
from tests.support.adapters import peft_greedy
from tests.support.servers import free_port

RPM = 60
ENDPOINT = {"name": "both", "config": {"served_entities": [{"name": "t", "entity_name": "tiny"}]}}


class Command:
    def __init__(self, model_dir: Path, tmp_path: Path, *extra: str, keys: str = "", name: tuple[str, ...] = ("--served-name", "tiny")) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp_path / "server.log"
        args = [sys.executable, "-m", "api.process.main", "serve", "--model", str(model_dir), *name, "--port", str(self.port),
                "--dtype", "float32", "--num-kv-blocks", "512", "--block-size", "4", "--num-threads", "1", "--no-embeddings", "--no-compile",
                "--api-servers", "2", *extra]  # fmt: skip
        with open(self.log_path, "wb") as log:
            env = {**os.environ, "SWITCHYARD_STATE_DIR": str(tmp_path), "SWITCHYARD_API_KEYS": keys}
            self.proc = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 120
        while self.log().count('"event": "listening"') < 2:  # the parent and the other front end
            assert self.proc.poll() is None and time.monotonic() < deadline, self.log()[-3000:]
            time.sleep(0.2)
        self.children = psutil.Process(self.proc.pid).children()
        assert sorted(c.cmdline()[2] for c in self.children) == ["actors.engine_process", "api.process.worker"], [c.cmdline() for c in self.children]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        psutil.wait_procs(self.children, timeout=10)


@pytest.fixture
def command(tiny_model_dir: Path, tmp_path: Path) -> Iterator[Command]:
    server = Command(tiny_model_dir, tmp_path, "--rate-limit-rpm", str(RPM), keys="key-a,key-b")
    yield server
    server.close()


A, B = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}  # a bucket each


async def _many(base_url: str, path: str, body: dict[str, object], n: int) -> list[httpx.Response]:
    """n requests at once with key A, each on its own connection (the kernel hands each to one front end)."""
    out: list[httpx.Response] = []

    async def one() -> None:
        async with httpx.AsyncClient(base_url=base_url, timeout=60, headers=A) as http:
            out.append(await http.post(path, json=body))

    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(one)
    return out


async def _streams(base_url: str, n: int, started: trio.Event, ends: list[str], tokens: int = 150) -> None:
    body = {"model": "tiny", "prompt": "The quick", "max_tokens": tokens, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}

    async def one() -> None:
        async with httpx.AsyncClient(base_url=base_url, timeout=60, headers=B) as http, http.stream("POST", "/v1/completions", json=body) as resp:
            lines = [line async for line in _mark(resp.aiter_lines(), started)]
        ends.append("\n".join(lines[-4:]))

    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(one)


async def _mark(lines: object, started: trio.Event) -> object:
    async for line in lines:  # type: ignore[attr-defined]
        started.set()
        yield line


async def test_two_front_ends_share_the_engine_the_limits_the_endpoints_and_metrics_and_drain(command: Command) -> None:
    began = time.monotonic()
    done = await _many(command.base_url, "/v1/completions", {"model": "tiny", "prompt": "hello there", "max_tokens": 4}, 24)
    assert [r.status_code for r in done] == [200] * 24
    front_ends = Counter(r.json()["id"].split("-")[1][:8] for r in done)
    assert len(front_ends) == 2, front_ends  # each front end names its requests with its own prefix

    async with httpx.AsyncClient(base_url=command.base_url, timeout=60, headers=A) as http:
        assert (await http.post("/api/2.0/serving-endpoints", json=ENDPOINT)).status_code == 200
    chat = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3}
    served = await _many(command.base_url, "/serving-endpoints/both/invocations", chat, 12)
    assert [r.status_code for r in served] == [200] * 12, [r.text for r in served if r.status_code != 200]

    burst = await _many(command.base_url, "/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 1}, 60)
    statuses = Counter(r.status_code for r in burst)
    admitted = 24 + 1 + 12 + statuses[200]
    # One bucket for key A across both front ends: RPM, and what refilled since the first
    # request (each front end with its own would have admitted all 97).
    assert set(statuses) <= {200, 429} and statuses[429] > 0, statuses
    assert RPM <= admitted <= RPM + (time.monotonic() - began) * RPM / 60 + 1, (admitted, statuses)

    async with httpx.AsyncClient(base_url=command.base_url, timeout=30) as http:
        for _ in range(4):  # whichever process answers, the same counts
            text = (await http.get("/metrics")).text
            assert _requests(text, "/v1/completions", 200) == 24 + statuses[200]
            assert _requests(text, "/v1/completions", 429) == statuses[429]

    # SIGTERM to the server: the streams of both front ends finish, then every process exits 0.
    started, ends = trio.Event(), list[str]()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_streams, command.base_url, 6, started, ends)
        await started.wait()
        command.proc.send_signal(signal.SIGTERM)
    assert len(ends) == 6 and all('"completion_tokens":150' in end and end.rstrip().endswith("data: [DONE]") for end in ends), ends
    assert command.proc.wait(30) == 0, command.log()[-3000:]
    gone, alive = psutil.wait_procs(command.children, timeout=10)
    assert not alive, alive


def _requests(text: str, route: str, status: int) -> float:
    """switchyard_http_requests_total for the route and status, over every model label."""
    lines = [line for line in text.splitlines() if line.startswith("switchyard_http_requests_total{") and f'route="{route}"' in line and f'status="{status}"' in line]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


async def test_an_adapter_serves_from_both_then_the_engine_process_dying_ends_the_streams_and_the_server_exits_1(
    tiny_model_dir: Path, tmp_path: Path, lora_adapters: dict[str, Path]
) -> None:  # fmt: skip
    from transformers import AutoTokenizer

    server = Command(tiny_model_dir, tmp_path, "--enable-lora", "--lora-modules", f"fixed={lora_adapters['all-r8']}", "--spec-decoding", "off")
    try:
        # An adapter named at start answers PEFT's own greedy text through both front ends.
        prompt = [5, 17, 23, 9, 41, 2, 60]
        expected = AutoTokenizer.from_pretrained(tiny_model_dir).decode(peft_greedy(tiny_model_dir, lora_adapters["all-r8"], [prompt])[0][:8])
        body = {"model": "fixed", "prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
        done = await _many(server.base_url, "/v1/completions", body, 12)
        assert [r.status_code for r in done] == [200] * 12, [r.text for r in done if r.status_code != 200]
        assert {r.json()["choices"][0]["text"] for r in done} == {expected}
        assert len(Counter(r.json()["id"].split("-")[1][:8] for r in done)) == 2  # both front ends answered
        started, ends = trio.Event(), list[str]()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_streams, server.base_url, 6, started, ends, 480)  # longer than the kill takes
            await started.wait()
            (engine,) = [c for c in server.children if "actors.engine_process" in c.cmdline()]
            engine.kill()
        assert len(ends) == 6 and all('"error"' in end for end in ends), ends
        assert server.proc.wait(30) == 1, server.log()[-3000:]
        assert "an engine process died" in server.log()
        gone, alive = psutil.wait_procs(server.children, timeout=10)
        assert not alive, alive
    finally:
        server.close()


def test_a_sigkill_to_the_server_leaves_no_front_end_or_engine_behind(tiny_model_dir: Path, tmp_path: Path) -> None:
    server = Command(tiny_model_dir, tmp_path, name=())  # the model served under its own name: the front ends agree on it
    try:
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(10)
        gone, alive = psutil.wait_procs(server.children, timeout=10)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        server.close()
