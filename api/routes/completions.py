"""POST /v1/completions: legacy text completions, streaming or not."""

from __future__ import annotations

import time
from typing import Any

from quart import Quart

from api import sse
from api.app import decode_body
from api.errors import json_response
from api.params import completion_params
from api.schemas import CompletionRequest
from api.streaming import Generation, sse_stream
from api.usage import usage_dict
from runtime.registry import ModelRegistry
from runtime.messages import TextDelta


def register(app: Quart, models: ModelRegistry) -> None:
    @app.post("/v1/completions")
    async def completions():  # type: ignore[no-untyped-def]
        req = await decode_body(CompletionRequest)
        runtime = models.resolve(req.model)
        prompt, sampling = completion_params(req)
        gen = await Generation(runtime, prompt, sampling).start()
        head = {
            "id": f"cmpl-{gen.request_id}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": runtime.served_name,
            "system_fingerprint": runtime.fingerprint,
        }
        if req.stream:
            return _stream(gen, head, include_usage=bool(req.stream_options and req.stream_options.include_usage))
        out = await gen.collect()
        choice = {
            "index": 0,
            "text": out.text,
            "logprobs": None,
            "finish_reason": out.finish_reason.value if out.finish_reason else None,
            "stop_reason": out.stop_reason,
        }
        return json_response({**head, "choices": [choice], "usage": usage_dict(out.usage)})


def _stream(gen: Generation, head: dict[str, Any], include_usage: bool):  # type: ignore[no-untyped-def]
    if include_usage:
        head = {**head, "usage": None}
    state: dict[str, Any] = {"usage": None}

    def render(delta: TextDelta) -> list[bytes]:
        if not delta.text and delta.finish_reason is None:
            return []
        finish = delta.finish_reason.value if delta.finish_reason is not None else None
        if finish is not None:
            state["usage"] = delta.usage
        choice = {"index": 0, "text": delta.text, "logprobs": None, "finish_reason": finish, "stop_reason": delta.stop_reason if finish else None}
        return [sse.data({**head, "choices": [choice]})]

    def tail() -> list[bytes]:
        out = []
        if include_usage:
            out.append(sse.data({**head, "choices": [], "usage": usage_dict(state["usage"])}))
        out.append(sse.DONE)
        return out

    return sse_stream(gen, render, tail)
