"""Azure ML chat completions: api-version, extra-parameters, deployments, error
bodies with x-ms-error-code, content parts; raw HTTP and the azure-ai-inference client."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from tests.support.servers import KEY, platform_client, platform_server

URL = "/chat/completions?api-version=2024-04-01-preview"
BODY = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}], "max_tokens": 2, "temperature": 0}


def assert_azure_error(r, status: int, code: str) -> dict:  # type: ignore[no-untyped-def]
    assert r.status_code == status, r.text
    assert r.headers["x-ms-error-code"] == code
    body = r.json()
    assert body["status"] == status and isinstance(body["error"], str) and body["message"]
    return body  # type: ignore[no-any-return]


async def test_chat_completions_api_version_and_errors(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    async with platform_server(tiny_model_dir, monkeypatch, tmp_path, names=("tiny-a", "tiny-b")) as srv, platform_client(srv) as http:
        r = await http.post(URL, json=BODY)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["object"] == "chat.completion" and body["model"] == "tiny-a"  # the default model
        assert body["system_fingerprint"] and body["usage"]["completion_tokens"] == 2
        r = await http.post("/chat/completions?api-version=2024-05-01-preview", json=BODY)
        assert r.status_code == 200

        # api-version: required, and one of the known ones.
        err = assert_azure_error(await http.post("/chat/completions", json=BODY), 400, "BadRequest")
        assert "api-version" in err["message"]
        err = assert_azure_error(await http.post("/chat/completions?api-version=1999-01-01", json=BODY), 400, "BadRequest")
        assert "1999-01-01" in err["message"] and "2024-04-01-preview" in err["message"]

        # azureml-model-deployment picks the model; an unknown one is a 404 NotFoundError.
        r = await http.post(URL, json=BODY, headers={"azureml-model-deployment": "tiny-b"})
        assert r.status_code == 200 and r.json()["model"] == "tiny-b"
        err = assert_azure_error(await http.post(URL, json=BODY, headers={"azureml-model-deployment": "nope"}), 404, "NotFound")
        assert "nope" in err["message"]

        # 422 UnprocessableContentError: detail[] with loc and value.
        err = assert_azure_error(await http.post(URL, json={**BODY, "temperature": 5}), 422, "UnprocessableContent")
        assert err["detail"] == [{"loc": ["body", "temperature"], "value": "5"}] and err["code"] == "UnprocessableContent"
        err = assert_azure_error(await http.post(URL, json={"messages": [{"role": "user", "content": 3}]}), 422, "UnprocessableContent")
        assert err["detail"][0]["loc"] == ["body", "messages", "0", "content"]
        assert_azure_error(await http.post(URL, content=b"{nope"), 400, "BadRequest")

        # Content parts: text is read, images are refused on a text-only model.
        parts = {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": " there"}]}
        r = await http.post(URL, json={**BODY, "messages": [parts]})
        assert r.status_code == 200, r.text
        for image in ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
                      {"type": "image", "content": "https://example.invalid/cat.png"}):
            msg = {"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}
            err = assert_azure_error(await http.post(URL, json={**BODY, "messages": [msg]}), 422, "UnprocessableContent")
            assert "text only" in err["message"] and err["detail"][0]["loc"] == ["body", "messages", "0", "content", "1", "type"]

        # Streaming: data-only SSE ending in [DONE].
        async with http.stream("POST", URL, json={**BODY, "stream": True}) as s:
            lines = [line async for line in s.aiter_lines() if line.startswith("data: ")]
        assert s.status_code == 200 and lines[-1] == "data: [DONE]"

        r = await http.get("/info?api-version=2024-05-01-preview", headers={"azureml-model-deployment": "tiny-b"})
        assert r.json()["model_name"] == "tiny-b" and r.json()["model_type"] == "chat-completion"


async def test_extra_parameters_header(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    extras = {**BODY, "top_k": 1, "ignore_eos": True, "max_tokens": 6, "made_up_knob": 3}
    async with platform_server(tiny_model_dir, monkeypatch, tmp_path) as srv, platform_client(srv) as http:
        # Default and `error`: 400 naming each extra parameter.
        for headers in ({}, {"extra-parameters": "error"}):
            err = assert_azure_error(await http.post(URL, json=extras, headers=headers), 400, "BadRequest")
            for name in ("top_k", "ignore_eos", "made_up_knob"):
                assert name in err["message"]
            assert [d["loc"] for d in err["detail"]] == [["body", "ignore_eos"], ["body", "made_up_knob"], ["body", "top_k"]]
        # `pass-through`: known extensions are honoured (ignore_eos makes all 6 tokens come).
        r = await http.post(URL, json=extras, headers={"extra-parameters": "pass-through"})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 6 and r.json()["choices"][0]["finish_reason"] == "length"
        # `ignore`: extras dropped; the request runs as if they were never sent.
        r = await http.post(URL, json={**extras, "n": 0}, headers={"extra-parameters": "ignore"})
        assert r.status_code == 200, r.text
        err = assert_azure_error(await http.post(URL, json=BODY, headers={"extra-parameters": "sometimes"}), 400, "BadRequest")
        assert "extra-parameters" in err["message"]


async def test_azure_ai_inference_client(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    inference = pytest.importorskip("azure.ai.inference")
    from azure.ai.inference.models import SystemMessage, UserMessage
    from azure.core.credentials import AzureKeyCredential
    from azure.core.exceptions import ClientAuthenticationError, HttpResponseError

    async with platform_server(tiny_model_dir, monkeypatch, tmp_path, names=("tiny-a", "tiny-b"), keys=(KEY,)) as srv:

        def run() -> None:
            # No keep-alive: an idle connection (one an exception still holds, say) would hold the
            # server's shutdown for its graceful timeout.
            close = {"Connection": "close"}
            chat = inference.ChatCompletionsClient(endpoint=srv.base_url, credential=AzureKeyCredential(KEY), headers=close)
            wrong = inference.ChatCompletionsClient(endpoint=srv.base_url, credential=AzureKeyCredential("sk-wrong"), headers=close)
            with chat, wrong:
                check(chat, wrong)

        def check(chat, wrong) -> None:  # type: ignore[no-untyped-def]
            messages = [SystemMessage(content="Be brief."), UserMessage(content="Hello")]
            result = chat.complete(messages=messages, max_tokens=3, temperature=0.0, headers={"azureml-model-deployment": "tiny-b"})
            assert result.model == "tiny-b" and result.choices[0].message.role == "assistant"
            assert result.usage.completion_tokens == 3
            # model_extras go to the body with `extra-parameters: pass-through`.
            result = chat.complete(messages=messages, max_tokens=4, model_extras={"ignore_eos": True, "top_k": 1})
            assert result.usage.completion_tokens == 4
            with chat.complete(messages=messages, max_tokens=3, stream=True, temperature=0.0, model_extras={"ignore_eos": True}) as updates:  # sampled, the random model's EOS can come first
                finishes = [u.choices[0].finish_reason for u in updates if u.choices]
            assert finishes[-1] == "length"
            info = chat.get_model_info()
            assert info.model_name == "tiny-a"
            with pytest.raises(HttpResponseError) as bad:
                chat.complete(messages=messages, temperature=9.0)
            assert bad.value.status_code == 422
            with pytest.raises(ClientAuthenticationError):
                wrong.complete(messages=messages)

        await trio.to_thread.run_sync(run)


async def test_pass_through_hands_engine_fields_on(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`pass-through`: fields outside Azure's table that the chat schema knows take effect (the
    same as on /v1/chat/completions); unknown ones are ignored, logged by name only."""
    import structlog

    body = {"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 12}
    async with platform_server(tiny_model_dir, monkeypatch, tmp_path) as srv, platform_client(srv) as http:

        async def text(extra: dict, mode: str = "pass-through") -> str:
            r = await http.post(URL, json={**body, **extra}, headers={"extra-parameters": mode})
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["message"]["content"]  # type: ignore[no-any-return]

        greedy = await text({"temperature": 0})
        # top_k=1 makes sampling at temperature 1 greedy, whatever the seed ...
        sampled = [await text({"temperature": 1.0, "top_k": 1, "seed": seed}) for seed in (1, 2, 3)]
        assert sampled == [greedy] * 3
        # ... and without it (`ignore` drops it) the seeds draw other texts.
        dropped = [await text({"temperature": 1.0, "top_k": 1, "seed": seed}, "ignore") for seed in (1, 2, 3)]
        assert any(t != greedy for t in dropped)
        # repetition_penalty changes the greedy text; dropped, it does not.
        assert await text({"temperature": 0, "repetition_penalty": 2.0}) != greedy
        assert await text({"temperature": 0, "repetition_penalty": 2.0}, "ignore") == greedy
        # A bad value of a known extension is a 422 naming it, as Azure ML's reference has it.
        r = await http.post(URL, json={**body, "top_k": "many"}, headers={"extra-parameters": "pass-through"})
        assert_azure_error(r, 422, "UnprocessableContent")
        assert r.json()["detail"][0]["loc"] == ["body", "top_k"]
        # Unknown to every schema: ignored, and logged by name (never by value).
        with structlog.testing.capture_logs() as logs:
            assert await text({"temperature": 0, "made_up_knob": "secret-value-4711"}) == greedy
        ignored = [e for e in logs if e["event"] == "extra_parameters_ignored"]
        assert ignored and ignored[0]["names"] == ["made_up_knob"]
        assert "secret-value-4711" not in repr(logs)


async def test_no_body_gives_a_server_error(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`messages` of the wrong type (it was enumerated as a list: a 500) and other odd bodies."""
    async with platform_server(tiny_model_dir, monkeypatch, tmp_path) as srv, platform_client(srv) as http:
        for messages in (3, True, "hello", {"role": "user"}, None, 2.5, [3], [None], [[{"type": "image_url"}]]):
            for mode in ("error", "ignore", "pass-through"):
                r = await http.post(URL, json={"messages": messages}, headers={"extra-parameters": mode})
                err = assert_azure_error(r, 422, "UnprocessableContent")
                assert err["detail"][0]["loc"][:2] == ["body", "messages"], (messages, err)
        for raw in (b"[]", b"3", b"null", b'"x"', b"{}", b"", b"\xff"):
            r = await http.post(URL, content=raw)
            assert 400 <= r.status_code < 500 and r.headers["x-ms-error-code"], (raw, r.status_code, r.text)


async def test_unknown_routes_and_wrong_methods_in_azure_shape(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    version = "?api-version=2024-04-01-preview"
    async with platform_server(tiny_model_dir, monkeypatch, tmp_path) as srv, platform_client(srv) as http:
        # Azure's routes this server does not serve: Azure ML's 404 NotFoundError.
        for path in ("/embeddings", "/images/embeddings", "/completions", "/v1/nothing-here"):
            err = assert_azure_error(await http.post(path + version, json={"input": "x"}), 404, "NotFound")
            assert "not supported" in err["message"] and "/chat/completions" in err["message"]
        assert_azure_error(await http.post("/embeddings", json={"input": "x"}), 404, "NotFound")  # an Azure path, even bare
        # Wrong methods: 405 with Allow, in Azure's shape, with or without api-version.
        for method, path, allowed in (("GET", "/chat/completions", "POST"), ("PUT", "/chat/completions" + version, "POST"),
                                      ("POST", "/info" + version, "GET"), ("DELETE", "/info", "GET")):
            r = await http.request(method, path)
            err = assert_azure_error(r, 405, "MethodNotAllowed")
            assert r.headers["allow"] == allowed and method in err["message"]
        # Other surfaces keep their own shapes.
        r = await http.get("/v1/nothing-here")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found" and "x-ms-error-code" not in r.headers
        r = await http.get("/v1/chat/completions")
        assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed" and r.headers["allow"] == "POST"
        r = await http.get("/api/2.0/serving-endpoints/x/nothing")
        assert r.status_code == 404 and r.json()["error_code"] == "ENDPOINT_NOT_FOUND"
    # And a 401 on an unknown Azure route is Azure's too.
    async with platform_server(tiny_model_dir, monkeypatch, tmp_path, keys=(KEY,)) as srv, platform_client(srv) as http:
        assert_azure_error(await http.post("/embeddings" + version, json={}), 401, "Unauthorized")
        assert_azure_error(await http.get("/anything" + version), 401, "Unauthorized")
