"""GET /metrics, request ids through every actor, the access log, and what is never logged."""

from __future__ import annotations

import httpx
import pytest
import structlog
import trio

from tests.support.http import samples, value
from tests.support.servers import Server, start_server, tiny_config
from tests.support.waiting import wait_idle

SECRET_PROMPT = "zebra quartz prompt-marker"


async def wait_for_log(logs: list[dict], event: str, timeout: float = 5.0, **fields: object) -> dict:
    """The access line is written after the last byte is sent, so just after the client sees it."""
    with trio.move_on_after(timeout):
        while True:
            for e in logs:
                if e["event"] == event and all(e.get(k) == v for k, v in fields.items()):
                    return e
            await trio.sleep(0.01)
    raise AssertionError(f"no {event} log line with {fields}")


async def test_metrics_cover_requests_latency_engine_and_loop(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        r = await http.post("/v1/completions", json={"prompt": "The quick", "max_tokens": 6, "ignore_eos": True})
        assert r.status_code == 200
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "stream": True, "ignore_eos": True}
        async with http.stream("POST", "/v1/chat/completions", json=body) as resp:
            assert resp.status_code == 200
            await resp.aread()
        r = await http.post("/v1/completions", json={"prompt": "x", "model": "no-such-model-4711"})
        assert r.status_code == 404
        r = await http.get("/no/such/route")
        assert r.status_code == 404
        await trio.sleep(0.35)  # a few event-loop lag samples
        r = await http.get("/metrics")
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/plain")
        m = samples(r.text)

    requests = "switchyard_http_requests_total"
    assert value(m, requests, route="/v1/completions", model="tiny", status="200") == 1
    assert value(m, requests, route="/v1/chat/completions", model="tiny", status="200") == 1
    assert value(m, requests, route="unmatched", status="404") == 1
    # An unknown model is counted, but its client-chosen name never becomes a label value.
    assert value(m, requests, route="/v1/completions", model="", status="404") == 1
    assert not any("no-such-model" in str(labels) for _, labels in m)

    for name in ("time_to_first_token", "e2e_request_latency", "request_queue_time"):
        assert value(m, f"switchyard_{name}_seconds_count", model="tiny") == 2, name
    assert value(m, "switchyard_inter_token_latency_seconds_count", model="tiny") == 5 + 4  # tokens after the first
    assert value(m, "switchyard_generation_tokens_total", model="tiny") == 11
    assert value(m, "switchyard_requests_finished_total", model="tiny", finish_reason="length") == 2
    assert value(m, "switchyard_step_tokens_count", model="tiny") >= 6
    assert value(m, "switchyard_step_tokens_sum", model="tiny") >= 11
    assert value(m, "switchyard_step_duration_seconds_count", model="tiny") >= 6
    assert value(m, "switchyard_event_loop_lag_seconds_count") >= 1
    runtime = server.runtime
    stats = runtime.statistics()  # type: ignore[attr-defined]
    assert value(m, "switchyard_kv_blocks_used", model="tiny") == stats["kv_blocks_used"]
    assert value(m, "switchyard_kv_blocks_free", model="tiny") == stats["kv_blocks_free"] > 0
    assert value(m, "switchyard_requests_running", model="tiny") == 0
    assert value(m, "switchyard_requests_waiting", model="tiny") == 0
    assert ("switchyard_prefix_cache_hit_rate", frozenset({("model", "tiny")})) in m
    assert value(m, "switchyard_engine_healthy", model="tiny") == 1


async def test_prefix_cache_hit_rate_moves(server: Server) -> None:
    prompt = "Paged attention keeps keys and values in fixed-size blocks. " * 3
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        for _ in range(2):
            r = await http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2})
            assert r.status_code == 200
        m = samples((await http.get("/metrics")).text)
    assert value(m, "switchyard_prefix_cache_hits_total", model="tiny") > 0
    assert 0 < value(m, "switchyard_prefix_cache_hit_rate", model="tiny") <= 1


@pytest.mark.in_process  # reads the scheduler's and executor's log lines
async def test_request_id_is_bound_at_the_edge_and_carried_through_the_actors(server: Server) -> None:
    with structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            body = {"prompt": SECRET_PROMPT, "max_tokens": 24, "ignore_eos": True, "stream": True}
            async with http.stream("POST", "/v1/completions", json=body) as resp:
                request_id = resp.headers["x-request-id"]
                raw = (await resp.aread()).decode()
        await wait_idle(server.runtime)
        await wait_for_log(logs, "http_request", request_id=request_id)
    assert f'"id":"cmpl-{request_id}"' in raw.replace(" ", "")  # the API's id is the edge's id
    mine = [e for e in logs if e.get("request_id") == request_id]
    events = {e["event"] for e in mine}
    assert {"request_finished", "http_request"} <= events, events
    access = next(e for e in mine if e["event"] == "http_request")
    assert access["status"] == 200 and access["route"] == "/v1/completions" and access["model"] == "tiny"
    assert access["method"] == "POST" and access["bytes_sent"] > 0 and access["duration_s"] > 0
    # One line per request, not per token; and the prompt and output are never logged.
    info = [e for e in mine if e["log_level"] == "info"]
    assert len(info) <= 3, [e["event"] for e in info]
    assert not any(SECRET_PROMPT.split()[0] in repr(e) for e in logs)


async def test_every_request_gets_an_access_line_even_when_the_client_leaves(server: Server) -> None:
    with structlog.testing.capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            body = {"prompt": "The", "max_tokens": 300, "ignore_eos": True, "stream": True}
            async with http.stream("POST", "/v1/completions", json=body) as resp:
                request_id = resp.headers["x-request-id"]
                async for line in resp.aiter_lines():
                    if line.startswith("data: "):
                        break
            r = await http.get("/health")
            assert r.status_code == 200
        await wait_idle(server.runtime)
        await wait_for_log(logs, "http_request", request_id=request_id)
        await wait_for_log(logs, "http_request", path="/health")
    access = [e for e in logs if e["event"] == "http_request"]
    gone = [e for e in access if e.get("request_id") == request_id]
    assert len(gone) == 1 and gone[0]["status"] == 499
    assert any(e["path"] == "/health" and e["status"] == 200 for e in access)


async def test_log_prompts_flag_logs_bodies_and_outputs(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            srv = await start_server(nursery, tiny_config(tiny_model_dir, log_prompts=True))
            async with httpx.AsyncClient(base_url=srv.base_url, timeout=30) as http:
                r = await http.post("/v1/completions", json={"prompt": SECRET_PROMPT, "max_tokens": 3})
                assert r.status_code == 200
            srv.stop.set()
    assert any(e["event"] == "request_body" and SECRET_PROMPT in e["body"] for e in logs)
    assert any(e["event"] == "request_output" and e["text"] == r.json()["choices"][0]["text"] for e in logs)
