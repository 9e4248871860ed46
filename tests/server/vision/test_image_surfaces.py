"""Images on every surface that takes them, served by a tiny LLaVA over a loopback socket: the
openai SDK's Chat image parts (data URIs) and Responses `input_image`, azure-ai-inference's
image item with `detail`, a Databricks invocation with an image; each answers what
transformers' own `generate` gives for the same image (greedy), and `usage.prompt_tokens`
counts the image's tokens. Then the fetch rules at the edge: an http(s) URL is a 400 naming
the part (nothing reaches the server or the model), an allow-listed origin is fetched.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import trio

import tests.support.clients  # noqa: F401 - the no-internet switches, before any client is imported
from api.http.platform.config import PlatformConfig
from api.http.platform.media import MediaPolicy
from tests.support.images import data_uri, image_server, pil_image, png_bytes
from tests.support.servers import Server, start_server, tiny_config
from tests.support.tiny_vlm import reference_generate
from tests.support.waiting import in_thread

CLOSE = {"Connection": "close"}
QUESTION = "What is in the picture?"
NUM_NEW = 8


@pytest.fixture(scope="module")
def expected(llava_dir: Path) -> str:
    from transformers import AutoTokenizer

    messages = [{"role": "user", "content": [{"type": "text", "text": QUESTION}, {"type": "image"}]}]
    tokens = reference_generate(llava_dir, messages, [pil_image(png_bytes(seed=7))], NUM_NEW)
    return str(AutoTokenizer.from_pretrained(llava_dir).decode(tokens, skip_special_tokens=True))


@pytest.fixture
async def vlm(llava_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Server]:
    monkeypatch.setenv("SWITCHYARD_STATE_DIR", str(tmp_path))
    monkeypatch.delenv("SWITCHYARD_API_KEYS", raising=False)
    async with trio.open_nursery() as nursery:
        srv = await start_server(nursery, tiny_config(llava_dir, max_num_batched_tokens=64))
        yield srv
        srv.stop.set()


def chat_parts(url: str, detail: str = "auto") -> list[dict[str, Any]]:
    return [{"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": url, "detail": detail}}]


async def test_every_surface_reads_an_image(vlm: Server, expected: str) -> None:
    uri = data_uri(png_bytes(seed=7))
    from azure.ai.inference import ChatCompletionsClient
    from azure.ai.inference.models import ImageContentItem, ImageDetailLevel, ImageUrl, TextContentItem, UserMessage
    from azure.core.credentials import AzureKeyCredential

    def run() -> tuple[Any, Any, Any]:
        with openai.OpenAI(base_url=vlm.openai_url, api_key="unused", max_retries=0, timeout=60, default_headers=CLOSE) as client:
            chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": chat_parts(uri)}], max_tokens=NUM_NEW, temperature=0)  # type: ignore[list-item]
            response = client.responses.create(
                model="tiny", input=[{"role": "user", "content": [{"type": "input_text", "text": QUESTION}, {"type": "input_image", "image_url": uri, "detail": "high"}]}],  # type: ignore[list-item]
                max_output_tokens=NUM_NEW, temperature=0,
            )  # fmt: skip
        with ChatCompletionsClient(endpoint=vlm.base_url, credential=AzureKeyCredential("unused"), headers=CLOSE) as azure:
            content = [TextContentItem(text=QUESTION), ImageContentItem(image_url=ImageUrl(url=uri, detail=ImageDetailLevel.LOW))]
            azure_out = azure.complete(messages=[UserMessage(content=content)], max_tokens=NUM_NEW, temperature=0)
        return chat, response, azure_out

    chat, response, azure_out = await in_thread(run)
    assert chat.choices[0].message.content == expected
    assert chat.usage is not None and chat.usage.prompt_tokens > 16  # the image's 16 tokens counted
    assert response.output_text == expected and response.usage is not None and response.usage.input_tokens == chat.usage.prompt_tokens
    assert azure_out.choices[0].message.content == expected
    async with httpx.AsyncClient(base_url=vlm.base_url, timeout=60, headers=CLOSE) as http:
        created = await http.post("/api/2.0/serving-endpoints", json={"name": "vision", "config": {"served_entities": [{"name": "v", "entity_name": "tiny"}]}})
        assert created.status_code == 200, created.text
        body = {"messages": [{"role": "user", "content": chat_parts(uri)}], "max_tokens": NUM_NEW, "temperature": 0}
        invoked = await http.post("/serving-endpoints/vision/invocations", json=body)
    assert invoked.status_code == 200, invoked.text
    assert invoked.json()["choices"][0]["message"]["content"] == expected


async def test_image_urls_are_refused_at_the_edge_and_nothing_reaches_the_model(vlm: Server) -> None:
    async with image_server() as images, httpx.AsyncClient(base_url=vlm.base_url, timeout=60, headers=CLOSE) as http:
        images.routes["/a.png"] = (200, [], png_bytes())
        messages = [{"role": "user", "content": "Look."}, {"role": "user", "content": [{"type": "text", "text": "this"}, *chat_parts(images.url("/a.png"))[1:]]}]
        refused = await http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "messages[1].content[1].image_url"
        bad_detail = await http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": chat_parts(data_uri(png_bytes()), "ultra")}]})
        assert bad_detail.status_code == 400 and bad_detail.json()["error"]["param"] == "messages[0].content[1].image_url.detail"
        truncated = await http.post("/v1/responses", json={"input": [{"role": "user", "content": [{"type": "input_image", "image_url": data_uri(png_bytes()[:100])}]}]})
        assert truncated.status_code == 400 and truncated.json()["error"]["param"] == "input[0].content[0].image_url"
        azure = await http.post(
            "/chat/completions?api-version=2024-05-01-preview", json={"messages": [{"role": "user", "content": chat_parts("http://10.0.0.1/x.png")}]}
        )
        # Azure ML's shape: a body that parses but cannot be served is a 422, its detail[] naming the part.
        assert azure.status_code == 422 and azure.json()["detail"][0]["loc"] == ["body", "messages", "0", "content", "1", "image_url"], azure.text
        assert images.hits == []
    stats = vlm.runtime.statistics()  # type: ignore[attr-defined]
    assert stats["prefill_tokens"] == 0 and stats.get("images_encoded", 0) == 0


async def test_an_allow_listed_origin_is_fetched(llava_dir: Path, expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWITCHYARD_STATE_DIR", str(tmp_path))
    async with image_server() as images, trio.open_nursery() as nursery:
        images.routes["/a.png"] = (200, [("Content-Type", "image/png")], png_bytes(seed=7))
        platform = PlatformConfig(state_dir=str(tmp_path), media=MediaPolicy(trusted_media_origins=(f"http://127.0.0.1:{images.port}",)))
        srv = await start_server(nursery, tiny_config(llava_dir, max_num_batched_tokens=64), platform=platform)
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=60, headers=CLOSE) as http:
            body = {"messages": [{"role": "user", "content": chat_parts(images.url("/a.png"))}], "max_tokens": NUM_NEW, "temperature": 0}
            got = await http.post("/v1/chat/completions", json=body)
            redirected = "/r.png"
            images.routes[redirected] = (302, [("Location", "http://169.254.169.254/latest/meta-data/")], b"")
            body["messages"] = [{"role": "user", "content": chat_parts(images.url(redirected))}]
            refused = await http.post("/v1/chat/completions", json=body)
        srv.stop.set()
    assert got.status_code == 200 and got.json()["choices"][0]["message"]["content"] == expected
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "messages[0].content[1].image_url"
    assert images.hits == ["/a.png", "/r.png"]
