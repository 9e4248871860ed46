"""POST /v1/responses: decode → params → runtime → one `ResponseObject` or an SSE stream of its
typed events.

The same `ResponsesEventBuilder` runs for both: streaming sends its events, non-streaming
returns the Response it built. Tool calls are read out of the text by the model's format's parser.

A request refused before generation (bad fields, prompt too long, overload) is an HTTP error.
Once admitted, a failure inside the engine is not: the Databricks Foundation Model API's
Response has a `failed` status with an `error` (type, code, message, param), so the client gets
that Response: HTTP 200 with whatever output was made before the failure (non-streaming), or
`error` + `response.failed` (streaming), alike. Imports quart, api.http.shared, api.http.openai
and runtime.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

import msgspec
from quart import Quart, Response

from api.http.openai.common.generation import Generation
from api.http.openai.common.grammars import validated
from api.http.openai.common.images import with_images
from api.http.openai.common.logprobs import token_logprobs
from api.http.openai.responses.events import Event, ResponsesEventBuilder, new_id
from api.http.openai.responses.params import responses_params
from api.http.openai.responses.request import ResponsesRequest
from api.http.openai.responses.response import response_usage
from api.http.openai.tools.formats import model_format
from api.http.openai.tools.output import OutputParser
from api.http.shared import sse
from api.http.shared.body import decode_body
from api.http.shared.errors import json_response
from api.http.shared.media.policy import media_policy
from api.http.shared.routes import bind
from runtime.errors import InvalidRequest, RequestFailed, ServingError
from runtime.logging import get_logger
from runtime.messages import FinishReason, Logprob, Usage
from runtime.registry import ModelRegistry

log = get_logger("responses")

# The tokenizer actor names Chat's fields; this endpoint calls them differently.
_PARAM = {"messages": "input", "prompt": "input"}  # max_tokens: SamplingParams.max_tokens_param names it


def register(app: Quart, models: ModelRegistry) -> None:
    async def create_response() -> Response:
        req = await decode_body(ResponsesRequest)
        runtime = models.resolve(req.model)
        params = await validated(
            responses_params, req, model_format(runtime), runtime.max_images_per_prompt > 0, runtime.thinking, runtime.sampling_defaults, compiles=bool(req.tools or req.text)
        )
        prompt = await with_images(params.prompt, params.images, runtime, media_policy())
        gen: Generation | RequestFailed
        try:
            gen = await _start(Generation(runtime, [prompt], params.sampling))
        except RequestFailed as exc:  # admitted, then failed before its first token
            gen = exc
        response = msgspec.structs.replace(params.response, id=new_id("resp"), created_at=int(time.time()), model=runtime.served_name)
        parser = OutputParser(runtime.thinking, params.sampling.thinking, params.output_parser())
        output = _Output(ResponsesEventBuilder(response), parser, runtime.tokenizer if params.logprobs else None)
        # Usage goes in every final Response, streamed or not: OpenAI's does, its SDK has no way
        # to ask for it, and agent frameworks read it there (stream_options.include_usage,
        # which the Databricks reference lists, is accepted and changes nothing).
        events = _events(gen, output)
        if req.stream:
            return sse.response(_sse(events))
        async for _ in events:
            pass
        return json_response(output.builder.response)

    bind(app, "create_response", create_response, ResponsesRequest)


async def _start(gen: Generation) -> Generation:
    try:
        return await gen.start()
    except InvalidRequest as exc:
        exc.param = _PARAM.get(exc.param or "", exc.param)
        raise


async def _sse(events: AsyncGenerator[Event]) -> AsyncIterator[bytes]:
    async with aclosing(events):  # a client that goes away closes the request now, not at GC
        async for name, payload in events:
            yield sse.event(name, payload)


async def _events(gen: Generation | RequestFailed, output: _Output) -> AsyncGenerator[Event]:
    """Every event of the Response, first to last; an engine failure ends it as failed."""
    for event in output.builder.start():
        yield event
    if isinstance(gen, RequestFailed):
        for event in output.fail(gen):
            yield event
        return
    try:
        async for _, delta in gen.deltas():
            events = output.feed(delta.text, delta.logprobs)
            if delta.finish_reason is not None:
                events += output.finish(delta.finish_reason, delta.usage)
            for event in events:
                yield event
    except Exception as exc:  # the engine failed this request mid-way: say so, then end
        if not isinstance(exc, ServingError):  # not the engine's verdict: a bug, worth a trace
            log.exception("response_failed")
        for event in output.fail(exc):
            yield event
    finally:
        gen.close()


class _Output:
    """Generated text → builder events, through the one output parser (tools/output.py): a
    reasoning model's thinking as a reasoning item, then the answer's text and calls.

    With logprobs asked for (`tokenizer` set), each delta's token logprobs go with the output
    text that delta made: a text event gets the logprobs of every delta whose text it overlaps
    (a delta that made no text yet rides with the next one); deltas that only made tool-call
    text (or whitespace the parser drops) are reported nowhere, as output_text is the only
    place the API has for them."""

    def __init__(self, builder: ResponsesEventBuilder, parser: OutputParser, tokenizer: Any = None) -> None:
        self.builder = builder
        self.parser = parser
        self.tokenizer = tokenizer
        self._fed = 0  # characters of output so far
        self._pending: deque[tuple[int, int, list[Logprob]]] = deque()  # (start, end, logprobs) per delta

    def feed(self, text: str, logprobs: list[Logprob] | None = None) -> list[Event]:
        start = self._fed
        self._fed += len(text)
        if self.tokenizer is not None and logprobs:
            if self._pending and self._pending[-1][0] == self._pending[-1][1] == start:  # a delta with no text yet
                logprobs = self._pending.pop()[2] + logprobs
            self._pending.append((start, self._fed, logprobs))
        return self._apply(self.parser.feed(text))

    def finish(self, reason: FinishReason | None, usage: Usage | None) -> list[Event]:
        events = self._apply(self.parser.finish())
        if reason is FinishReason.ABORT:
            return events + self.builder.fail("The request was aborted.", usage=response_usage(usage))
        # LENGTH is max_output_tokens or, without it, the end of the context window; the SDK's
        # IncompleteDetails.reason has "max_output_tokens" for both (the output limit then is
        # the room the prompt left), and no other value that fits.
        status = "incomplete" if reason is FinishReason.LENGTH else "completed"
        return events + self.builder.finish(status, response_usage(usage), "max_output_tokens")

    def fail(self, exc: BaseException) -> list[Event]:
        """The engine's failure; with its usage where it counted one (`RequestFailed.usage`)."""
        usage = exc.usage if isinstance(exc, RequestFailed) and isinstance(exc.usage, Usage) else None
        return self.builder.fail(str(exc) or type(exc).__name__, usage=response_usage(usage))

    def _text(self, text: str, start: int) -> list[Event]:
        if not text:
            return []
        end = start + len(text)
        entries: list[Logprob] = []
        while self._pending:
            a, b, logprobs = self._pending[0]
            if b <= start and not a == b == start:  # made text that was not output text
                self._pending.popleft()
            elif a < end:
                entries += self._pending.popleft()[2]
            else:
                break
        if self.tokenizer is None:
            return self.builder.text(text)
        return self.builder.text(text, token_logprobs(self.tokenizer, entries))

    def _apply(self, parsed: list[tuple[Any, ...]]) -> list[Event]:
        events: list[Event] = []
        for kind, *rest in parsed:
            if kind == "text":
                events += self._text(rest[0], rest[1])
            elif kind == "reasoning":
                events += self.builder.reasoning(rest[0])
            elif kind == "start":
                events += self.builder.call_start(rest[0].kind, rest[0].name, rest[0].call_id)
            elif kind == "delta":
                events += self.builder.call_delta(rest[1])
            else:
                events += self.builder.call_done(rest[0].complete)
        return events
