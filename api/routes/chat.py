"""POST /v1/chat/completions: decode → params → runtime → one JSON body or an SSE stream."""

from __future__ import annotations

import time
from typing import Any

from quart import Quart

from api import sse
from api.app import decode_body
from api.errors import json_response
from api.params import chat_params
from api.schemas import ChatCompletionRequest
from api.streaming import Generation, sse_stream
from api.usage import usage_dict
from runtime.registry import ModelRegistry
from runtime.messages import TextDelta


def register(app: Quart, models: ModelRegistry) -> None:
    @app.post("/v1/chat/completions")
    async def chat_completions():  # type: ignore[no-untyped-def]
        req = await decode_body(ChatCompletionRequest)
        runtime = models.resolve(req.model)
        prompt, sampling = chat_params(req)
        gen = await Generation(runtime, prompt, sampling).start()
        head = {
            "id": f"chatcmpl-{gen.request_id}",
            "created": int(time.time()),
            "model": runtime.served_name,
            "system_fingerprint": runtime.fingerprint,
        }
        if req.stream:
            return _stream(gen, head, include_usage=bool(req.stream_options and req.stream_options.include_usage))
        out = await gen.collect()
        message = {"role": "assistant", "content": out.text, "refusal": None, "tool_calls": None}
        body = {
            **head,
            "object": "chat.completion",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": out.finish_reason.value if out.finish_reason else None,
                    "stop_reason": out.stop_reason,
                }
            ],
            "usage": usage_dict(out.usage),
        }
        return json_response(body)


def _stream(gen: Generation, head: dict[str, Any], include_usage: bool):  # type: ignore[no-untyped-def]
    head = {**head, "object": "chat.completion.chunk"}
    if include_usage:
        head["usage"] = None
    state: dict[str, Any] = {"sent_role": False, "usage": None}

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return sse.data({**head, "choices": [choice]})

    def render(delta: TextDelta) -> list[bytes]:
        out = []
        if not state["sent_role"]:
            state["sent_role"] = True
            out.append(chunk({"role": "assistant", "content": ""}))
        if delta.text:
            out.append(chunk({"content": delta.text}))
        if delta.finish_reason is not None:
            out.append(chunk({}, delta.finish_reason.value))
            state["usage"] = delta.usage
        return out

    def tail() -> list[bytes]:
        out = []
        if include_usage:
            out.append(sse.data({**head, "choices": [], "usage": usage_dict(state["usage"])}))
        out.append(sse.DONE)
        return out

    return sse_stream(gen, render, tail)
