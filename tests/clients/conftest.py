"""Fixtures of the real-client layer: the live server (tests/conftest.py) driven by third-party
client code, each pointed at the loopback socket, with telemetry, retries and downloads off.

Synchronous clients run in a worker thread (`in_thread`) while the server runs in the test's
trio loop; asyncio clients run in a worker thread of their own event loop (`in_asyncio`).

Tool calls need a model that writes them. Two ways, as in tests/responses:
- `forced`: real generation on a tiny random model under the grammar that a forcing
  tool_choice (`required` or a named tool) compiles, so the arguments are random but valid
  and, with a `seed`, the same on every run of a request (`forced_server`);
- `script`: the route's `Generation` swapped for a script (tests/responses/scripted.py), for
  exact text: a call's head and its first arguments in one delta, a text answer after a
  tool result, several calls.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import openai
import pytest
import trio

import api.openai.chat
import api.openai.responses
from runtime.messages import FinishReason
from tests.conftest import Server, start_server, tiny_config
from tests.responses.scripted import Script

T = TypeVar("T")

# No client may reach the internet: no telemetry, no tracing export, no hub or price-list
# downloads (each library's own switch, set before it is imported).
for _name, _value in {
    "OPENAI_AGENTS_DISABLE_TRACING": "1",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_TELEMETRY": "False",
    "DATABRICKS_CONFIG_FILE": os.devnull,
    "HF_HUB_OFFLINE": "1",
    "OTEL_SDK_DISABLED": "true",
}.items():
    os.environ.setdefault(_name, _value)

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


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return await trio.to_thread.run_sync(partial(fn, *args, **kwargs))


async def in_asyncio(make: Callable[[], Awaitable[T]]) -> T:
    """An asyncio client's coroutine, run to completion on its own loop in a worker thread."""
    return await trio.to_thread.run_sync(lambda: asyncio.run(_awaited(make)))


async def _awaited(make: Callable[[], Awaitable[T]]) -> T:
    return await make()


def script(monkeypatch: pytest.MonkeyPatch, text: str, step: int = 3, finish: FinishReason = FinishReason.STOP, fail_at: int | None = None) -> Script:
    """Every Chat and Responses request (Databricks' and Azure's included) "generates" `text`
    in pieces of `step` characters."""
    s = Script([text[i : i + step] for i in range(0, len(text), step)], finish, fail_at=fail_at)
    monkeypatch.setattr(api.openai.responses, "Generation", s)
    monkeypatch.setattr(api.openai.chat, "Generation", s)
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
    monkeypatch.setattr(api.openai.responses, "Generation", s)
    monkeypatch.setattr(api.openai.chat, "Generation", s)
    return s


@pytest.fixture(scope="session")
def long_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with room for a tools block in its prompt."""
    from tests.tiny_model import build_tiny_decoder

    return build_tiny_decoder(tmp_path_factory.mktemp("tiny-long"), "llama", perturb_norms=False, max_position_embeddings=2048)


@pytest.fixture
async def forced_server(long_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Server]:
    monkeypatch.setenv("SWITCHYARD_STATE_DIR", str(tmp_path))
    async with trio.open_nursery() as nursery:
        server = await start_server(nursery, tiny_config(long_model_dir, max_num_batched_tokens=256))
        yield server
        server.stop.set()


@pytest.fixture
def client(forced_server: Server) -> Iterator[openai.OpenAI]:
    # Closed after each test: an idle keep-alive connection would hold up the server's shutdown.
    with openai.OpenAI(base_url=forced_server.openai_url, api_key="unused", max_retries=0, timeout=120) as c:
        yield c
