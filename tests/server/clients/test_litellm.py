"""LiteLLM, the LLM gateway, against the live server through two of its providers.

- `openai/`: any OpenAI-compatible server (`api_base` = /v1). Streamed tool calls go through
  its `stream_chunk_builder`, which rebuilds the message from the chunks; with the first
  arguments fragment sent twice it raised JSONDecodeError.
- `databricks/`: LiteLLM's own Databricks provider, which speaks only Databricks'
  OpenAI-compatible paths (`api_base` = {host}/serving-endpoints, the endpoint in `model`):
  those were 404 before (item 3). Chat, streamed and not, and embeddings.

No call leaves the machine: the model cost map is the packaged one and telemetry is off
(tests/clients/conftest.py sets LiteLLM's switches before it is imported), no retries.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from api.http.openai.tools.spec import format_call
from runtime.config import RuntimeConfig
from tests.support.clients import CHAT_FORECAST, CHAT_WEATHER, script
from tests.support.servers import Server, start_server, tiny_config
from tests.support.waiting import in_thread

PARIS = '{"city": "Paris"}'
TWO_CALLS = format_call("function", "get_weather", PARIS) + "\n" + format_call("function", "forecast", '{"days": 3}')
MESSAGES = [{"role": "user", "content": "Weather in Paris, and the forecast?"}]
# LiteLLM keeps its HTTP clients, and their idle keep-alive connections would hold up each
# test server's shutdown for its graceful timeout: no keep-alive.
CLOSE = {"Connection": "close"}


@pytest.fixture
def litellm() -> Iterator[Any]:
    import litellm

    litellm.suppress_debug_info = True  # else it prints where to find its provider list
    litellm.telemetry = False
    yield litellm


def calls_of(message: Any) -> list[tuple[str, Any]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


async def test_openai_provider_rebuilds_streamed_parallel_calls(litellm: Any, forced_server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    script(monkeypatch, TWO_CALLS, step=1000)
    common: dict[str, Any] = dict(model="openai/tiny", api_base=forced_server.openai_url, api_key="unused", messages=MESSAGES, tools=[CHAT_WEATHER, CHAT_FORECAST], max_retries=0, extra_headers=CLOSE)

    def run() -> tuple[Any, Any]:
        chunks = list(litellm.completion(**common, stream=True, stream_options={"include_usage": True}))
        return litellm.stream_chunk_builder(chunks, messages=MESSAGES), litellm.completion(**common)

    built, whole = await in_thread(run)
    expected = [("get_weather", {"city": "Paris"}), ("forecast", {"days": 3})]
    assert calls_of(built.choices[0].message) == calls_of(whole.choices[0].message) == expected
    assert built.choices[0].finish_reason == whole.choices[0].finish_reason == "tool_calls"
    assert built.usage.prompt_tokens == whole.usage.prompt_tokens == 7  # the script's, streamed too


async def test_openai_provider_streams_real_forced_calls(litellm: Any, forced_server: Server) -> None:
    common: dict[str, Any] = dict(
        model="openai/tiny", api_base=forced_server.openai_url, api_key="unused", messages=MESSAGES, tools=[CHAT_WEATHER, CHAT_FORECAST],
        tool_choice="required", seed=7, max_tokens=60, max_retries=0, extra_headers=CLOSE,
    )  # fmt: skip

    def run() -> tuple[Any, Any]:
        chunks = list(litellm.completion(**common, stream=True))
        return litellm.stream_chunk_builder(chunks, messages=MESSAGES), litellm.completion(**common)

    built, whole = await in_thread(run)
    assert calls_of(built.choices[0].message) == calls_of(whole.choices[0].message) and calls_of(whole.choices[0].message)


async def test_databricks_provider_chat_streamed_and_not(litellm: Any, forced_server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    script(monkeypatch, TWO_CALLS, step=1000)
    common: dict[str, Any] = dict(
        model="databricks/tiny", api_base=forced_server.base_url + "/serving-endpoints", api_key="dapi-unused", messages=MESSAGES,
        tools=[CHAT_WEATHER, CHAT_FORECAST], max_retries=0, extra_headers=CLOSE,
    )  # fmt: skip

    def run() -> tuple[Any, Any]:
        chunks = list(litellm.completion(**common, stream=True))
        return litellm.stream_chunk_builder(chunks, messages=MESSAGES), litellm.completion(**common)

    built, whole = await in_thread(run)
    expected = [("get_weather", {"city": "Paris"}), ("forecast", {"days": 3})]
    assert calls_of(built.choices[0].message) == calls_of(whole.choices[0].message) == expected


async def test_databricks_provider_embeddings(litellm: Any, tiny_model_dir: Path, tiny_bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWITCHYARD_STATE_DIR", str(tmp_path))
    embedder = RuntimeConfig(model=str(tiny_bert_dir), served_name="tiny-embed", task="embeddings", dtype="float32", num_threads=1, port=0)
    async with trio.open_nursery() as nursery:
        server = await start_server(nursery, tiny_config(tiny_model_dir), embedder)
        result = await in_thread(
            litellm.embedding, model="databricks/tiny-embed", input=["a cat", "a dog"], api_base=server.base_url + "/serving-endpoints", api_key="dapi-unused",
            extra_headers=CLOSE,
        )
        server.stop.set()
    assert [len(item["embedding"]) for item in result.data] == [32, 32] and result.data[0]["embedding"] != result.data[1]["embedding"]
