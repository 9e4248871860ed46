"""API keys on every route, and per-key rate limits (429 + Retry-After), end to end and as units."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import msgspec
import pytest
import structlog
import trio

from api.http.platform.config import PlatformConfig
from api.http.shared.auth import AuthMiddleware, RateLimiter, TokenBucket, _UsageMeter, estimate_tokens
from tests.support.servers import KEY, OTHER_KEY, auth, platform_client, platform_server

OPEN = {"/health", "/metrics"}
CHAT = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2}


def every_route() -> list[tuple[str, str]]:
    """(method, path) of every route create_app registers, parameters filled in."""
    from api.http.app import create_app
    from runtime.registry import ModelRegistry

    app = create_app(ModelRegistry([]), PlatformConfig())
    routes = []
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static":
            continue
        path = re.sub(r"<(?:[a-z]+:)?[A-Za-z_]+>", "x", rule.rule)
        routes += [(method, path) for method in sorted(rule.methods - {"HEAD", "OPTIONS"})]
    return routes


async def test_every_route_needs_a_key_but_health_and_metrics(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    routes = every_route()
    paths = {path for _, path in routes}
    assert {"/v1/chat/completions", "/chat/completions", "/serving-endpoints/x/invocations", "/api/2.0/serving-endpoints"} <= paths
    async with platform_server(tiny_model_dir, monkeypatch, tmp_path, keys=(KEY, OTHER_KEY)) as srv, platform_client(srv) as http:
        with structlog.testing.capture_logs() as logs:
            for method, path in routes:
                for headers in ({}, auth("sk-wrong"), {"Authorization": KEY}, {"Authorization": f"Basic {KEY}"}, {"Authorization": "Bearer"}):
                    r = await http.request(method, path, headers=headers, json={})
                    if path in OPEN:
                        assert r.status_code != 401, (method, path)
                        continue
                    assert r.status_code == 401, (method, path, headers, r.status_code)
                    assert r.headers["www-authenticate"] == "Bearer"
                for key in (KEY, OTHER_KEY):
                    r = await http.request(method, path, headers={"Authorization": f"bearer {key}"}, json={})
                    assert r.status_code != 401, (method, path, r.text)
        assert KEY not in repr(logs) and OTHER_KEY not in repr(logs)  # keys are never logged
        assert any(entry["event"] == "unauthorized" for entry in logs)

        # Each surface answers in its own error shape.
        r = await http.post("/v1/chat/completions", json=CHAT)
        assert r.json()["error"]["code"] == "invalid_api_key"
        r = await http.post("/chat/completions?api-version=2024-04-01-preview", json=CHAT)
        assert r.headers["x-ms-error-code"] == "Unauthorized" and r.json()["status"] == 401
        r = await http.post("/serving-endpoints/tiny/invocations", json=CHAT)
        assert r.json()["error_code"] == "UNAUTHENTICATED"
        r = await http.post("/serving-endpoints/tiny/invocations", json=CHAT, headers=auth())
        assert r.status_code == 200


def test_keys_are_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    import api.http.shared.auth

    calls: list[tuple[bytes, bytes]] = []
    real = api.http.shared.auth.hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(api.http.shared.auth.hmac, "compare_digest", counting)
    middleware = AuthMiddleware(None, PlatformConfig(api_keys=("k1", "k2", "k3")))
    for given, expected in ((b"k1", 0), (b"k3", 2), (b"nope", None), (b"", None)):
        calls.clear()
        assert middleware.identify([(b"authorization", b"Bearer " + given)]) == expected
        assert len(calls) == 3  # every key is compared, whichever matches
    assert middleware.identify([]) is None


def test_config_from_environment_hides_keys() -> None:
    config = PlatformConfig.from_env(
        {"SWITCHYARD_API_KEYS": " a1 ,b2,,", "SWITCHYARD_RATE_LIMIT_RPM": "30", "SWITCHYARD_STATE_DIR": "/tmp/x"}, api_keys=["c3", "a1"]
    )
    assert config.api_keys == ("a1", "b2", "c3") and config.requests_per_minute == 30 and config.tokens_per_minute is None
    assert str(config.endpoints_db) == "/tmp/x/serving_endpoints.sqlite3"
    assert "a1" not in repr(config) and "<3 keys>" in repr(config)
    assert PlatformConfig.from_env({}).api_keys == ()
    with pytest.raises(ValueError):
        PlatformConfig(requests_per_minute=0)


def test_cli_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from api.http.platform.config import add_arguments, from_args

    monkeypatch.setenv("SWITCHYARD_API_KEYS", "env-key")
    monkeypatch.setenv("SWITCHYARD_RATE_LIMIT_RPM", "10")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--api-key", "k1", "--api-key", "k2", "--rate-limit-tpm", "5000", "--state-dir", "/srv/state"])
    config = from_args(args)
    assert config.api_keys == ("env-key", "k1", "k2")
    assert (config.requests_per_minute, config.tokens_per_minute, config.state_dir) == (10, 5000, "/srv/state")
    assert from_args(parser.parse_args(["--rate-limit-rpm", "3"])).requests_per_minute == 3


def test_token_buckets_refill_and_settle() -> None:
    now = [0.0]
    limiter = RateLimiter(PlatformConfig(requests_per_minute=2, tokens_per_minute=600), clock=lambda: now[0])
    assert limiter.admit("k", 500) == (0.0, "")
    wait, which = limiter.admit("k", 500)  # 100 tokens left, 500 needed at 10/s
    assert which == "tokens" and wait == pytest.approx(40.0)
    limiter.settle("k", 500, 120)  # it really used 120: 380 come back
    assert limiter.admit("k", 400) == (0.0, "")
    wait, which = limiter.admit("k", 1)  # both requests of the minute used
    assert which == "requests" and wait == pytest.approx(30.0)
    now[0] += 30.0
    assert limiter.admit("k", 1) == (0.0, "")
    assert limiter.admit("other", 1) == (0.0, "")  # per key
    limiter.settle("k", 10, 1000)  # used more than charged: the bucket goes negative
    assert limiter.accounts["k"].tokens.level < 0
    bucket = TokenBucket(60, lambda: 0.0)
    assert bucket.wait_for(1000) == 0.0  # a request larger than the bucket waits for a full one only


def test_estimates_and_usage_metering() -> None:
    body = msgspec.json.encode({"messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 50, "n": 2})
    prompt, generate = estimate_tokens(body)
    assert prompt == len(body) // 4 and generate == 100
    assert estimate_tokens(b"not json") == (2, 0)
    sse = {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
    meter = _UsageMeter()
    meter.start(sse)
    meter.feed(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n')
    meter.feed(b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}\n\n')
    meter.feed(b"data: [DONE]\n\n")
    assert meter.used(100, 50) == 7
    stream = _UsageMeter()
    stream.start(sse)
    for _ in range(5):
        stream.feed(b'data: {"choices":[]}\n\n')
    assert stream.used(10, 50) == 15  # no usage chunk: prompt + one token per event
    whole = _UsageMeter()
    whole.start({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    whole.feed(b'{"usage": {"total_tokens"')
    whole.feed(b": 42}}")
    assert whole.used(1, 1) == 42
    refused = _UsageMeter()
    refused.start({"type": "http.response.start", "status": 400, "headers": []})
    assert refused.used(10, 50) == 0


async def test_requests_per_minute_per_key(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    async with platform_server(tiny_model_dir, monkeypatch, tmp_path, keys=(KEY, OTHER_KEY), rpm=5) as srv, platform_client(srv, KEY) as http:
        results: list[httpx.Response] = []
        streams: list[list[str]] = []

        async def one(route: str) -> None:
            body = {**CHAT, "max_tokens": 8, "ignore_eos": True, "stream": True}
            async with http.stream("POST", route, json=body) as s:
                await s.aread()
                results.append(s)
                if s.status_code == 200:
                    streams.append([line for line in s.text.splitlines() if line.startswith("data: ")])

        # A burst of 12 over a 5-a-minute key: 5 admitted, and every admitted one completes.
        async with trio.open_nursery() as nursery:
            for i in range(12):
                nursery.start_soon(one, "/v1/chat/completions" if i % 2 else "/serving-endpoints/tiny/invocations")
        statuses = sorted(r.status_code for r in results)
        assert statuses == [200] * 5 + [429] * 7
        for lines in streams:
            assert lines[-1] == "data: [DONE]"
            finishes = [msgspec.json.decode(line[6:])["choices"][0]["finish_reason"] for line in lines[:-1]]
            assert finishes[-1] == "length" and "error" not in "".join(lines)
        for r in results:
            if r.status_code == 429:
                assert 1 <= int(r.headers["retry-after"]) <= 12  # one request comes back every 12 s
        r = await http.get("/v1/models")
        assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
        r = await http.post("/chat/completions?api-version=2024-04-01-preview", json=CHAT)
        assert r.status_code == 429 and r.headers["x-ms-error-code"] == "TooManyRequests" and "retry-after" in r.headers
        r = await http.get("/api/2.0/serving-endpoints")
        assert r.status_code == 429 and r.json()["error_code"] == "REQUEST_LIMIT_EXCEEDED"
        assert (await http.get("/health")).status_code == 200  # open routes are not limited
        # The other key has its own budget.
        r = await http.post("/v1/chat/completions", json=CHAT, headers=auth(OTHER_KEY))
        assert r.status_code == 200
        # Refused before the app routed them, they are still counted under their route template.
        r = await http.post("/serving-endpoints/tiny/invocations", json=CHAT, headers=auth("sk-wrong"))
        assert r.status_code == 401
        assert (await http.get("/no/such/route")).status_code == 429  # limited like any request
        metrics = (await http.get("/metrics")).text
        counted = {
            (labels["route"], labels["status"]): value
            for labels, value in _samples(metrics, "switchyard_http_requests_total")
        }
        assert counted[("/v1/chat/completions", "429")] + counted[("/serving-endpoints/<name>/invocations", "429")] == 7
        assert counted[("/v1/models", "429")] == 1 and counted[("/chat/completions", "429")] == 1
        assert counted[("/api/2.0/serving-endpoints", "429")] == 1
        assert counted[("/serving-endpoints/<name>/invocations", "401")] == 1
        assert counted[("unmatched", "429")] == 1  # no route has that path: the label stays bounded


def _samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    from prometheus_client.parser import text_string_to_metric_families

    return [(s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples if s.name == name]


async def test_tokens_per_minute_charge_real_usage(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    async with platform_server(tiny_model_dir, monkeypatch, tmp_path, keys=(KEY,), tpm=300) as srv, platform_client(srv, KEY) as http:
        # Bounded by max_tokens: the estimate (~body/4 + 200) fits the 300 of a fresh minute.
        r = await http.post("/v1/chat/completions", json={**CHAT, "max_tokens": 200, "ignore_eos": True})
        assert r.status_code == 200, r.text
        used = r.json()["usage"]["total_tokens"]
        assert used > 200
        # What is left (300 - used, plus 5 a second) cannot cover another such request ...
        r = await http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 200})
        assert r.status_code == 429 and "tokens" in r.json()["error"]["message"]
        assert int(r.headers["retry-after"]) >= 10
        # ... but a small one fits, since the first was charged what it really used.
        r = await http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 5})
        assert r.status_code == 200, r.text
