"""Faults stay contained: a failing step fails its requests only, a detokenizer exception fails
its request only, and /health tells a stuck device step from a working one. What failed goes
to the log; the client's error says only that it failed, under its request id."""

from __future__ import annotations

import json

import httpx
import pytest
import structlog
import trio

from actors import detokenizer as detokenizer_module
from actors.detok_core import IncrementalDetokenizer
from runtime.config import RuntimeConfig
from tests.support.fakes import fake_runtime
from tests.support.http import serves_normally, sse_payloads
from tests.support.servers import start_runtime_server
from tests.support.waiting import wait_idle

POISON = 250  # a token id: any step that feeds it to the fake device raises


def fake_config(**overrides: object) -> RuntimeConfig:
    settings: dict[str, object] = dict(served_name="fake", port=0, max_num_batched_tokens=64, drain_timeout=2.0)
    settings.update(overrides)
    return RuntimeConfig(**settings)  # type: ignore[arg-type]


async def status_and_payloads(http: httpx.AsyncClient, body: dict) -> tuple[int, list[str]]:
    async with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
        raw = (await resp.aread()).decode()
    return resp.status_code, sse_payloads(raw)


async def test_a_failing_step_fails_its_requests_and_the_engine_carries_on(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    with structlog.testing.capture_logs() as logs:  # the failure's detail, which the client must not see
        runtime = fake_runtime(
            tiny_model_dir, fake_config(), step_delay=0.002, fail_if=lambda plan: any(POISON in s.token_ids for s in plan.seqs)
        )
        async with trio.open_nursery() as nursery:
            srv = await start_runtime_server(nursery, runtime)
            async with httpx.AsyncClient(base_url=srv.base_url, timeout=30) as http:
                results: dict[str, object] = {}

                async def bystander() -> None:  # streaming while the poison arrives: shares its step
                    results["bystander"] = await status_and_payloads(http, {"prompt": [5, 6, 7], "max_tokens": 200, "ignore_eos": True})

                async def poisoned() -> None:
                    await trio.sleep(0.05)
                    results["poison"] = await http.post("/v1/completions", json={"prompt": [5, POISON, 7], "max_tokens": 5})

                with trio.fail_after(20):
                    async with trio.open_nursery() as inner:
                        inner.start_soon(bystander)
                        inner.start_soon(poisoned)

                poison = results["poison"]
                assert isinstance(poison, httpx.Response)
                assert poison.status_code == 500, poison.text
                assert poison.json()["error"]["type"] == "server_error"
                message = poison.json()["error"]["message"]
                assert "injected" not in message and f"request id {poison.headers['x-request-id']}" in message, message
                assert any("injected device failure" in str(line.get("error")) for line in logs if line["event"] == "request_failed")
                # The bystander shared the failed step: it ends with a clean error event and [DONE].
                status, events = results["bystander"]  # type: ignore[misc]
                assert status == 200 and events[-1] == "[DONE]"
                last = json.loads(events[-2])
                assert last["error"]["code"] == "request_failed", last
                assert runtime.executor.num_failed_steps >= 1
                await wait_idle(runtime)
                # The engine carries on.
                await serves_normally(srv.base_url)
                m = (await http.get("/metrics")).text
                assert 'switchyard_step_failures_total{model="fake"}' in m
            srv.stop.set()
        assert runtime.runner.closed


async def test_a_detokenizer_exception_fails_that_request_only(tiny_model_dir, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    class Exploding(IncrementalDetokenizer):
        def push(self, token_ids: list[int]):  # type: ignore[no-untyped-def]
            if "<<boom>>" in self._stop and len(self.text) > 3:
                raise ValueError("decoder state corrupted")
            return super().push(token_ids)

    monkeypatch.setattr(detokenizer_module, "IncrementalDetokenizer", Exploding)
    runtime = fake_runtime(tiny_model_dir, fake_config(), step_delay=0.002)
    async with trio.open_nursery() as nursery:
        srv = await start_runtime_server(nursery, runtime)
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=30) as http:
            results: dict[str, tuple[int, list[str]]] = {}

            async def run(name: str, body: dict) -> None:
                results[name] = await status_and_payloads(http, body)

            with trio.fail_after(20):
                async with trio.open_nursery() as inner:
                    inner.start_soon(run, "bad", {"prompt": [5, 6, 7], "max_tokens": 60, "ignore_eos": True, "stop": ["<<boom>>"]})
                    inner.start_soon(run, "good", {"prompt": [5, 6, 7], "max_tokens": 60, "ignore_eos": True})
            status, bad = results["bad"]
            assert status == 200 and bad[-1] == "[DONE]"
            message = json.loads(bad[-2])["error"]["message"]
            assert "request id" in message and "decoder state" not in message, message
            status, good = results["good"]
            assert status == 200 and good[-1] == "[DONE]"
            assert json.loads(good[-2])["choices"][0]["finish_reason"] == "length"
            await wait_idle(runtime)
            await serves_normally(srv.base_url)
        srv.stop.set()


async def test_health_turns_503_while_a_step_overruns_its_deadline(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    runtime = fake_runtime(tiny_model_dir, fake_config(step_deadline=0.2))
    async with trio.open_nursery() as nursery:
        srv = await start_runtime_server(nursery, runtime)
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=30) as http:
            assert (await http.get("/health")).status_code == 200
            runtime.runner.release.clear()  # the next step hangs on the device thread
            done: list[httpx.Response] = []

            async def request() -> None:
                done.append(await http.post("/v1/completions", json={"prompt": [5, 6], "max_tokens": 3}))

            nursery.start_soon(request)
            with trio.fail_after(10):
                while True:
                    r = await http.get("/health")
                    if r.status_code == 503:
                        break
                    await trio.sleep(0.05)
            assert "a step has been running" in r.json()["reason"]
            m = (await http.get("/metrics")).text
            assert 'switchyard_engine_healthy{model="fake"} 0.0' in m
            runtime.runner.release.set()  # the device recovers: healthy again, and the request completes
            with trio.fail_after(10):
                while not done:
                    await trio.sleep(0.02)
            assert done[0].status_code == 200
            assert (await http.get("/health")).status_code == 200
        srv.stop.set()
