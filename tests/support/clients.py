"""The real-client layer's helpers: no client reaches the internet, the tools the tests offer,
and the two ways a tiny random model is made to write tool calls.

Synchronous clients run in a worker thread (`tests.support.waiting.in_thread`) while the server
runs in the test's trio loop; asyncio clients run in a worker thread of their own event loop
(`in_asyncio`). Tool calls: `forced` generation (a forcing tool_choice's grammar on the tiny
model; the `forced_server` fixture) or `script` (the route's `Generation` swapped for a script,
tests/support/scripted.py) for exact text.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
import trio

import api.http.openai.chat.view
import api.http.openai.responses.view
from runtime.messages import FinishReason
from tests.support.scripted import Script

# No client may reach the internet: no telemetry, no tracing export, no hub or price-list
# downloads (each library's own switch, set before it is imported: tests/server/clients/conftest.py
# imports this module before any test module there imports a client).
for _name, _value in {
    "OPENAI_AGENTS_DISABLE_TRACING": "1",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_TELEMETRY": "False",
    "DATABRICKS_CONFIG_FILE": os.devnull,
    "HF_HUB_OFFLINE": "1",
    "OTEL_SDK_DISABLED": "true",
}.items():
    os.environ.setdefault(_name, _value)

T = TypeVar("T")

# Small schemas: whatever the random model writes under the grammar is short and valid.
CITY = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Rome"]}}, "required": ["city"], "additionalProperties": False}
DAYS = {"type": "object", "properties": {"days": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["days"], "additionalProperties": False}
WORD = {"type": "grammar", "syntax": "regex", "definition": "[a-z]{1,6}"}  # a custom tool's input format
CHAT_WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.", "parameters": CITY}}
CHAT_FORECAST = {"type": "function", "function": {"name": "forecast", "description": "Forecast for some days.", "parameters": DAYS}}
CHAT_SHOUT = {"type": "custom", "custom": {"name": "shout", "description": "Shout a word.", "format": WORD}}
RESP_WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city.", "parameters": CITY, "strict": True}
RESP_FORECAST = {"type": "function", "name": "forecast", "description": "Forecast for some days.", "parameters": DAYS, "strict": True}
RESP_SHOUT = {"type": "custom", "name": "shout", "description": "Shout a word.", "format": WORD}


async def in_asyncio(make: Callable[[], Awaitable[T]]) -> T:
    """An asyncio client's coroutine, run to completion on its own loop in a worker thread."""
    return await trio.to_thread.run_sync(lambda: asyncio.run(_awaited(make)))


async def _awaited(make: Callable[[], Awaitable[T]]) -> T:
    return await make()


def script(monkeypatch: pytest.MonkeyPatch, text: str, step: int = 3, finish: FinishReason = FinishReason.STOP, fail_at: int | None = None) -> Script:
    """Every Chat and Responses request (Databricks' and Azure's included) "generates" `text`
    in pieces of `step` characters."""
    s = Script([text[i : i + step] for i in range(0, len(text), step)], finish, fail_at=fail_at)
    monkeypatch.setattr(api.http.openai.responses.view, "Generation", s)
    monkeypatch.setattr(api.http.openai.chat.view, "Generation", s)
    return s


class Turns(Script):
    """A script per request, in order (the last one repeats): an agent's tool call, then its
    answer once the tool's result is back. `calls` holds each request's (prompt, sampling), so
    a test can read what the client sent back (the tool's result in the prompt)."""

    def __init__(self, texts: list[str], step: int = 3) -> None:
        super().__init__([])
        self.texts = texts
        self.step = step

    def __call__(self, runtime: Any, prompts: list[Any], sampling: Any, n: int = 1) -> Any:
        text = self.texts[min(len(self.calls), len(self.texts) - 1)]
        self.pieces = [text[i : i + self.step] for i in range(0, len(text), self.step)]
        return super().__call__(runtime, prompts, sampling, n)


def turns(monkeypatch: pytest.MonkeyPatch, texts: list[str], step: int = 3) -> Turns:
    s = Turns(texts, step)
    monkeypatch.setattr(api.http.openai.responses.view, "Generation", s)
    monkeypatch.setattr(api.http.openai.chat.view, "Generation", s)
    return s
