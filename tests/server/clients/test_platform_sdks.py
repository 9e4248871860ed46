"""The platforms' own SDKs, streaming tool calls: `azure-ai-inference` on Azure ML's chat
route and `databricks-sdk` on serving endpoints, its `get_open_ai_client()` included, which
points the openai SDK at Databricks' OpenAI-compatible paths.

tests/platform covers these SDKs' plain chat, errors and endpoint management; here the model
calls tools (scripted: two calls, the head and arguments of each in one delta) and the SDKs
accumulate them from the stream as their users do.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from api.http.openai.tools.spec import format_call
from tests.support.clients import CHAT_FORECAST, CHAT_WEATHER, script
from tests.support.servers import AB, KEY, platform_server
from tests.support.waiting import in_thread

TWO_CALLS = format_call("function", "get_weather", '{"city": "Paris"}') + "\n" + format_call("function", "forecast", '{"days": 3}')
EXPECTED = [("get_weather", {"city": "Paris"}), ("forecast", {"days": 3})]
CLOSE = {"Connection": "close"}  # no idle keep-alive connection to hold up the server's shutdown


def accumulate(deltas: list[Any]) -> list[tuple[str, Any]]:
    """Tool calls from streamed deltas, by index, as an openai SDK client builds them."""
    calls: dict[int, list[str]] = {}
    for delta in deltas:
        for tc in delta.tool_calls or []:
            entry = calls.setdefault(tc.index, ["", ""])
            entry[0] += tc.function.name or ""
            entry[1] += tc.function.arguments or ""
    return [(name, json.loads(arguments)) for name, arguments in (calls[i] for i in sorted(calls))]


def accumulate_by_id(deltas: list[Any]) -> list[tuple[str, Any]]:
    """As azure-ai-inference's streaming-with-tools sample does: its typed tool-call update
    (`StreamingChatResponseToolCallUpdate`) has `id` and `function` but no `index` (the raw
    mapping keeps it), so a delta that carries an `id` starts a call and the next fragments
    extend it. That works because a call's `id` comes in its first delta only, as OpenAI's."""
    calls: list[list[str]] = []
    for delta in deltas:
        for tc in delta.tool_calls or []:
            if tc.id:
                calls.append(["", ""])
            calls[-1][0] += tc.function.name or ""
            calls[-1][1] += tc.function.arguments or ""
    return [(name, json.loads(arguments)) for name, arguments in calls]


async def test_azure_ai_inference_streams_tool_calls(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from azure.ai.inference import ChatCompletionsClient
    from azure.ai.inference.models import ChatCompletionsToolDefinition, FunctionDefinition, UserMessage
    from azure.core.credentials import AzureKeyCredential

    script(monkeypatch, TWO_CALLS, step=1000)
    tools = [ChatCompletionsToolDefinition(function=FunctionDefinition(**t["function"])) for t in (CHAT_WEATHER, CHAT_FORECAST)]
    async with platform_server(tiny_model_dir, monkeypatch, tmp_path, keys=(KEY,)) as srv:

        def run() -> tuple[list[Any], Any]:
            with ChatCompletionsClient(endpoint=srv.base_url, credential=AzureKeyCredential(KEY), headers=CLOSE) as chat:
                messages = [UserMessage(content="Weather in Paris, and the forecast?")]
                with chat.complete(messages=messages, tools=tools, stream=True) as updates:
                    streamed = [u for u in updates if u.choices]
                return streamed, chat.complete(messages=messages, tools=tools)

        streamed, whole = await in_thread(run)
    assert accumulate_by_id([u.choices[0].delta for u in streamed]) == EXPECTED
    assert [tc["index"] for u in streamed for tc in u.choices[0].delta.tool_calls or []][0] == 0  # in the mapping
    assert [(c.function.name, json.loads(c.function.arguments)) for c in whole.choices[0].message.tool_calls] == EXPECTED
    assert streamed[-1].choices[0].finish_reason == "tool_calls"


async def test_databricks_sdk_openai_client_reaches_an_endpoint(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`WorkspaceClient.serving_endpoints.get_open_ai_client()`: the openai SDK at
    {host}/serving-endpoints with the workspace's auth; the endpoint in `model`, its traffic
    split applied. Before item 3 every call was a 404."""
    from databricks.sdk import WorkspaceClient

    for name in [n for n in os.environ if n.startswith(("DATABRICKS_", "ARM_", "AZURE_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("DATABRICKS_CONFIG_FILE", str(tmp_path / "no-databrickscfg"))
    script(monkeypatch, TWO_CALLS, step=1000)
    async with platform_server(tiny_model_dir, monkeypatch, tmp_path, names=("tiny-a", "tiny-b"), keys=(KEY,)) as srv:

        def run() -> tuple[list[Any], Any, str]:
            w = WorkspaceClient(host=srv.base_url, token=KEY, auth_type="pat")
            w.api_client._api_client._session.headers.update(CLOSE)  # as tests/platform does: no public knob
            w.api_client.do("POST", "/api/2.0/serving-endpoints", body=AB)
            with w.serving_endpoints.get_open_ai_client(max_retries=0, default_headers=CLOSE) as client:
                common: dict[str, Any] = dict(model="ab-test", messages=[{"role": "user", "content": "Weather?"}], tools=[CHAT_WEATHER, CHAT_FORECAST])
                streamed = [c.choices[0].delta for c in client.chat.completions.create(**common, stream=True) if c.choices]
                raw = client.chat.completions.with_raw_response.create(**common)
                return streamed, raw.parse(), raw.headers["served-model-name"]

        streamed, whole, served = await in_thread(run)
    assert accumulate(streamed) == EXPECTED
    assert [(c.function.name, json.loads(c.function.arguments)) for c in whole.choices[0].message.tool_calls] == EXPECTED
    assert served in ("a", "b") and whole.model in ("tiny-a", "tiny-b")
