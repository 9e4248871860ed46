"""Locust load tests for Switchyard's OpenAI-compatible routes, against 127.0.0.1 only.

User classes (pick with their names on the command line; all run when none is named):
    ChatUser         POST /v1/chat/completions, streaming (2/3) and not (1/3)
    CompletionsUser  POST /v1/completions, streaming and not
    EmbeddingsUser   POST /v1/embeddings {model, input}
    ResponsesUser    POST /v1/responses {model, input}, streaming and not

Prompts and output lengths follow `prompts.PROMPT_MIX`. For a streaming request the POST row
times the response headers (which the server sends with the first token); it also reports
"STREAM" (the whole stream), "TTFT" (to the first content chunk, or to the end of an empty
output) and "ITL" (mean gap between content chunks, per request) as their own rows.
Always bounded: pass --run-time and --users; the host must be loopback.

    .venv/bin/switchyard serve --port 8000 &
    .venv/bin/locust -f ops/load/locustfile.py --headless --host http://127.0.0.1:8000 \\
        --users 8 --spawn-rate 2 --run-time 60s --csv /tmp/sy ChatUser CompletionsUser

Environment: SWITCHYARD_MODEL (the `model` field; default: omitted, the server's default),
SWITCHYARD_EMBED_MODEL (for EmbeddingsUser), LOCUST_SEED (prompt draws; default 0),
SWITCHYARD_API_KEY (a server with API keys: sent as `Authorization: Bearer <key>` on every
request; also settable as --api-key on locust's command line; never printed).

    SWITCHYARD_API_KEY=sk-... .venv/bin/locust -f ops/load/locustfile.py --headless \\
        --host http://127.0.0.1:8000 --users 8 --spawn-rate 2 --run-time 60s ChatUser
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections.abc import Callable
from itertools import count
from typing import Any
from urllib.parse import urlsplit

from locust import HttpUser, between, events, task

sys.path.insert(0, os.path.dirname(__file__))
from prompts import draw, embedding_inputs  # noqa: E402

MODEL = os.environ.get("SWITCHYARD_MODEL")
EMBED_MODEL = os.environ.get("SWITCHYARD_EMBED_MODEL")
_seeds = count(int(os.environ.get("LOCUST_SEED", "0")))


@events.init_command_line_parser.add_listener
def _add_arguments(parser: Any, **_kwargs: Any) -> None:
    parser.add_argument(
        "--api-key", env_var="SWITCHYARD_API_KEY", default="", is_secret=True, include_in_web_ui=False,
        help="Bearer key for a server with API keys (default: $SWITCHYARD_API_KEY)",
    )


def api_key(environment: Any) -> str:
    parsed = getattr(environment, "parsed_options", None)
    return (getattr(parsed, "api_key", None) if parsed is not None else None) or os.environ.get("SWITCHYARD_API_KEY", "")


@events.init.add_listener
def _loopback_only(environment: Any, **_kwargs: Any) -> None:
    host = urlsplit(environment.host or "").hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        raise SystemExit(f"refusing to load-test {environment.host!r}: only 127.0.0.1 / localhost")
    parsed = environment.parsed_options
    if parsed is not None and getattr(parsed, "headless", False) and not getattr(parsed, "run_time", None):
        raise SystemExit("pass --run-time: load runs must be bounded")


def _with_model(body: dict, model: str | None = MODEL) -> dict:
    return {**body, "model": model} if model else body


class _Base(HttpUser):
    abstract = True
    wait_time = between(0.1, 0.5)

    def on_start(self) -> None:
        self.rng = random.Random(next(_seeds))
        key = api_key(self.environment)
        if key:
            self.client.headers["Authorization"] = f"Bearer {key}"

    def _post(self, name: str, path: str, body: dict) -> None:
        with self.client.post(path, json=body, name=name, catch_response=True) as resp:
            if resp.status_code != 200:
                resp.failure(f"{resp.status_code}: {resp.text[:200]}")

    def _stream(self, name: str, path: str, body: dict[str, Any], is_content: Callable[[dict[str, Any]], bool]) -> None:
        """POST with stream=true; report the whole stream, TTFT and ITL as separate rows."""
        start = time.perf_counter()
        first = last = None
        chunks = 0
        with self.client.post(path, json={**body, "stream": True}, name=name, stream=True, catch_response=True) as resp:
            if resp.status_code != 200:
                resp.failure(f"{resp.status_code}: {resp.text[:200]}")
                return
            try:
                for line in resp.iter_lines():
                    if not line or not line.startswith(b"data: "):
                        continue
                    if line == b"data: [DONE]":
                        break
                    payload = json.loads(line[6:])
                    if payload.get("type") in ("error", "response.failed") or isinstance(payload.get("error"), dict):
                        resp.failure(f"error event: {json.dumps(payload)[:200]}")
                        return
                    now = time.perf_counter()
                    if is_content(payload):
                        first = first or now
                        last = now
                        chunks += 1
                    elif first is None and _finished(payload):  # an empty output: its one token was EOS
                        first = now
            except Exception as exc:  # a cut stream
                resp.failure(f"stream broken: {exc}")
                return
        self._metric("STREAM", name, (time.perf_counter() - start) * 1000)
        if first is not None:
            self._metric("TTFT", name, (first - start) * 1000)
        if chunks > 1 and first is not None and last is not None:
            self._metric("ITL", name, (last - first) * 1000 / (chunks - 1))

    def _metric(self, kind: str, name: str, ms: float) -> None:
        self.environment.events.request.fire(
            request_type=kind, name=name, response_time=ms, response_length=0, exception=None, context={}
        )


def _finished(payload: dict) -> bool:
    choices = payload.get("choices") or []
    return bool(choices and choices[0].get("finish_reason")) or payload.get("type") == "response.completed"


def _chat_content(payload: dict) -> bool:
    choices = payload.get("choices") or []
    return bool(choices and choices[0].get("delta", {}).get("content"))


def _completion_content(payload: dict) -> bool:
    choices = payload.get("choices") or []
    return bool(choices and choices[0].get("text"))


def _responses_content(payload: dict) -> bool:
    return payload.get("type") == "response.output_text.delta"


class ChatUser(_Base):
    @task(2)
    def chat_stream(self) -> None:
        prompt, max_tokens = draw(self.rng)
        body = _with_model({"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens})
        self._stream("chat stream", "/v1/chat/completions", body, _chat_content)

    @task(1)
    def chat(self) -> None:
        prompt, max_tokens = draw(self.rng)
        body = _with_model({"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens})
        self._post("chat", "/v1/chat/completions", body)


class CompletionsUser(_Base):
    @task(1)
    def completion_stream(self) -> None:
        prompt, max_tokens = draw(self.rng)
        self._stream("completions stream", "/v1/completions", _with_model({"prompt": prompt, "max_tokens": max_tokens}), _completion_content)

    @task(1)
    def completion(self) -> None:
        prompt, max_tokens = draw(self.rng)
        self._post("completions", "/v1/completions", _with_model({"prompt": prompt, "max_tokens": max_tokens}))


class EmbeddingsUser(_Base):
    @task
    def embed(self) -> None:
        self._post("embeddings", "/v1/embeddings", _with_model({"input": embedding_inputs(self.rng)}, EMBED_MODEL))


class ResponsesUser(_Base):
    @task(1)
    def respond_stream(self) -> None:
        prompt, max_tokens = draw(self.rng)
        body = _with_model({"input": prompt, "max_output_tokens": max_tokens})
        self._stream("responses stream", "/v1/responses", body, _responses_content)

    @task(1)
    def respond(self) -> None:
        prompt, max_tokens = draw(self.rng)
        self._post("responses", "/v1/responses", _with_model({"input": prompt, "max_output_tokens": max_tokens}))
