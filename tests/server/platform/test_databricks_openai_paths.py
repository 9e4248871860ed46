"""Databricks' OpenAI-compatible paths: `POST /serving-endpoints/chat/completions`,
`/serving-endpoints/completions` and `/serving-endpoints/embeddings`, the endpoint named by the
body's `model`, so that `OpenAI(base_url=f"{host}/serving-endpoints")` reaches a serving
endpoint. They are invocations: the traffic split draws the served entity, the response names it
in `served-model-name`, and errors come in Databricks' shape.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.support.servers import AB, KEY, auth, platform_client, platform_server

CHAT = {"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 2}


async def test_chat_and_completions_reach_the_endpoint_the_body_names(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    async with platform_server(tiny_model_dir, monkeypatch, tmp_path, names=("tiny-a", "tiny-b"), keys=(KEY,)) as srv, platform_client(srv, KEY) as http:
        r = await http.post("/api/2.0/serving-endpoints", json=AB)
        assert r.status_code == 200, r.text
        served = Counter()
        for _ in range(12):
            r = await http.post("/serving-endpoints/chat/completions", json={**CHAT, "model": "ab-test"})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["object"] == "chat.completion" and body["model"] == {"a": "tiny-a", "b": "tiny-b"}[r.headers["served-model-name"]]
            served[r.headers["served-model-name"]] += 1
        assert set(served) <= {"a", "b"} and sum(served.values()) == 12
        r = await http.post("/serving-endpoints/completions", json={"model": "tiny-a", "prompt": "Once", "max_tokens": 2})
        assert r.status_code == 200 and r.json()["object"] == "text_completion" and r.headers["served-model-name"] == "tiny-a", r.text
        async with http.stream("POST", "/serving-endpoints/chat/completions", json={**CHAT, "model": "ab-test", "stream": True}) as s:
            text = (await s.aread()).decode()
        assert s.status_code == 200 and text.rstrip().endswith("data: [DONE]") and '"chat.completion.chunk"' in text
        # The API key applies as on every Databricks route.
        async with platform_client(srv) as anonymous:
            r = await anonymous.post("/serving-endpoints/chat/completions", json={**CHAT, "model": "ab-test"})
        assert r.status_code == 401 and r.json()["error_code"] == "UNAUTHENTICATED", r.text


async def test_errors_are_databricks_shaped_and_name_the_field(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    async with platform_server(tiny_model_dir, monkeypatch, tmp_path) as srv, platform_client(srv) as http:
        r = await http.post("/serving-endpoints/chat/completions", json=CHAT)  # no model: no endpoint
        assert r.status_code == 400 and r.json()["error_code"] == "INVALID_PARAMETER_VALUE" and "model" in r.json()["message"], r.text
        r = await http.post("/serving-endpoints/chat/completions", json={**CHAT, "model": "nope"})
        assert r.status_code == 404 and r.json()["error_code"] == "RESOURCE_DOES_NOT_EXIST", r.text
        r = await http.post("/serving-endpoints/embeddings", json={"model": "tiny", "input": "embed me"})
        assert r.status_code == 400 and "/serving-endpoints/chat/completions" in r.json()["message"], r.text
        r = await http.post("/serving-endpoints/chat/completions", json={"model": "tiny", "messages": "hi"})
        assert r.status_code == 400 and r.json()["error_code"] == "INVALID_PARAMETER_VALUE" and "messages" in r.json()["message"], r.text
        r = await http.post("/serving-endpoints/completions", content=b"{not json")
        assert r.status_code == 400 and r.json()["error_code"] == "MALFORMED_REQUEST", r.text
        r = await http.get("/serving-endpoints/chat/completions")
        assert r.status_code == 405 and "error_code" in r.json(), r.text


async def test_the_openapi_document_lists_them(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    async with platform_server(tiny_model_dir, monkeypatch, tmp_path) as srv, platform_client(srv) as http:
        paths = (await http.get("/openapi.json", headers=auth())).json()["paths"]
    for path in ("/serving-endpoints/chat/completions", "/serving-endpoints/completions", "/serving-endpoints/embeddings"):
        assert "requestBody" in paths[path]["post"], path
