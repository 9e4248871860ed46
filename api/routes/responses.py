"""POST /v1/responses: decode → params → runtime → one Response object or a typed SSE stream.

The same `ResponsesEventBuilder` runs for both: streaming sends its events, non-streaming
returns the Response it built. Tool calls are read out of the text by `ToolCallParser`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from quart import Quart

from api import sse
from api.app import decode_body
from api.errors import json_response
from api.params_responses import responses_params
from api.responses_events import Event, ResponsesEventBuilder, new_id
from api.schemas_responses import ResponsesRequest
from api.streaming import Generation, sse_response
from api.tools import ToolCallParser, ToolSet, template_takes_tools
from runtime.errors import InvalidRequest, RequestFailed
from runtime.messages import FinishReason, Usage
from runtime.registry import ModelRegistry

# The tokenizer actor names Chat's fields; this endpoint calls them differently.
_PARAM = {"messages": "input", "prompt": "input", "max_tokens": "max_output_tokens"}


def register(app: Quart, models: ModelRegistry) -> None:
    from api import openapi

    openapi.register_body("/v1/responses", ResponsesRequest)

    @app.post("/v1/responses")
    async def create_response():  # type: ignore[no-untyped-def]
        req = await decode_body(ResponsesRequest)
        runtime = models.resolve(req.model)
        params = responses_params(req, template_tools=template_takes_tools(runtime.tokenizer))
        gen = await _start(Generation(runtime, [params.prompt], params.sampling))
        response = {"id": new_id("resp"), "object": "response", "created_at": int(time.time()), "model": runtime.served_name, **params.echo}
        output = _Output(ResponsesEventBuilder(response), params.toolset)
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return sse_response(_stream(gen, output, include_usage))
        (out,) = await gen.collect()
        output.feed(out.text)
        output.finish(out.finish_reason, out.usage)
        if output.builder.response["status"] == "failed":
            raise RequestFailed(output.builder.response["error"]["message"])
        return json_response(output.builder.response)


async def _start(gen: Generation) -> Generation:
    try:
        return await gen.start()
    except InvalidRequest as exc:
        exc.param = _PARAM.get(exc.param or "", exc.param)
        raise


async def _stream(gen: Generation, output: _Output, include_usage: bool) -> AsyncIterator[bytes]:
    try:
        for name, payload in output.builder.start():
            yield sse.event(name, payload)
        async for _, delta in gen.deltas():
            events = output.feed(delta.text)
            if delta.finish_reason is not None:
                events += output.finish(delta.finish_reason, delta.usage if include_usage else None)
            for name, payload in events:
                yield sse.event(name, payload)
    except Exception as exc:  # the engine failed this request mid-stream: say so, then end
        for name, payload in output.builder.fail(str(exc) or type(exc).__name__):
            yield sse.event(name, payload)
    finally:
        gen.close()


class _Output:
    """Generated text → builder events, through the tool-call parser when tools may be called."""

    def __init__(self, builder: ResponsesEventBuilder, toolset: ToolSet | None) -> None:
        self.builder = builder
        self.parser = ToolCallParser(toolset) if toolset is not None and toolset.callable() else None

    def feed(self, text: str) -> list[Event]:
        if self.parser is None:
            return self.builder.text(text)
        return self._apply(self.parser.feed(text))

    def finish(self, reason: FinishReason | None, usage: Usage | None) -> list[Event]:
        events = self._apply(self.parser.finish()) if self.parser is not None else []
        if reason is FinishReason.ABORT:
            return events + self.builder.fail("The request was aborted.")
        status = "incomplete" if reason is FinishReason.LENGTH else "completed"
        return events + self.builder.finish(status, usage_json(usage), "max_output_tokens")

    def _apply(self, parsed: list[tuple[Any, ...]]) -> list[Event]:
        events: list[Event] = []
        for kind, *rest in parsed:
            if kind == "text":
                events += self.builder.text(rest[0])
            elif kind == "start":
                events += self.builder.call_start(rest[0].kind, rest[0].name, rest[0].call_id)
            elif kind == "delta":
                events += self.builder.call_delta(rest[1])
            else:
                events += self.builder.call_done(rest[0].complete)
        return events


def usage_json(usage: Usage | None) -> dict[str, Any] | None:
    """The Responses `usage` object. These models spend no hidden reasoning tokens."""
    if usage is None:
        return None
    return {
        "input_tokens": usage.prompt_tokens,
        # The SDK's type requires cache_write_tokens; the prefix cache does not count writes.
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }
