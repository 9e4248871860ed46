"""POST /v1/chat/completions: decode → params → runtime → one `ChatCompletion` or an SSE stream
of `ChatCompletionChunk`s.

`respond` is also what Azure ML's chat route and Databricks' chat invocations answer with
(create_app hands it to them through surface.py `HANDLERS`). Imports quart, api.http.shared,
api.http.openai and runtime.
"""

from __future__ import annotations

import time

import msgspec
from quart import Quart, Response

from api.http.openai.chat.params import ChatParams, chat_request
from api.http.openai.chat.request import ChatCompletionRequest
from api.http.openai.chat.response import ChatCompletion, ChatCompletionChunk, Choice, ChunkChoice, Delta
from api.http.openai.chat.thinking import StreamedMessage, assistant_message, message_parts
from api.http.openai.common.generation import Collected, Generation, sse_stream
from api.http.openai.common.grammars import validated
from api.http.openai.common.images import with_images
from api.http.openai.common.logprobs import ChatLogprobs, chat_logprobs
from api.http.openai.common.usage import chat_usage
from api.http.openai.tools.formats import model_format
from api.http.shared import sse
from api.http.shared.body import decode_body
from api.http.shared.errors import json_response
from api.http.shared.media.policy import media_policy
from api.http.shared.routes import bind
from runtime.messages import FinishReason, TextDelta
from runtime.protocol import Runtime
from runtime.registry import ModelRegistry


def register(app: Quart, models: ModelRegistry) -> None:
    async def chat_completions() -> Response:
        return await respond(models, await decode_body(ChatCompletionRequest))

    bind(app, "chat_completions", chat_completions, ChatCompletionRequest)


async def respond(models: ModelRegistry, req: ChatCompletionRequest, blocks: bool = False) -> Response:
    """A decoded chat request → its JSON body or SSE stream. `blocks`: a reasoning model answers
    in Databricks' content blocks (chat/thinking.py)."""
    runtime = models.resolve(req.model)
    params = await validated(
        chat_request, req, model_format(runtime), runtime.max_images_per_prompt > 0, runtime.thinking, runtime.sampling_defaults, compiles=bool(req.tools or req.response_format)
    )
    prompt = await with_images(params.prompt, params.images, runtime, media_policy())
    gen = await Generation(runtime, [prompt], params.sampling, params.sampling.n).start()
    completion_id, created, model, fingerprint = f"chatcmpl-{gen.request_id}", int(time.time()), runtime.served_name, runtime.fingerprint
    if req.stream:
        head = ChatCompletionChunk(id=completion_id, created=created, model=model, system_fingerprint=fingerprint, choices=[])
        return _stream(runtime, gen, head, req, params, blocks)
    outs = await gen.collect()
    choices = [_choice(runtime, i, out, req.logprobs, params, blocks) for i, out in enumerate(outs)]
    usage = chat_usage([o.usage for o in outs if o.usage is not None], flat_reasoning=blocks and (runtime.thinking is not None or params.thinks))
    return json_response(ChatCompletion(id=completion_id, created=created, model=model, system_fingerprint=fingerprint, choices=choices, usage=usage))


async def respond_blocks(models: ModelRegistry, req: ChatCompletionRequest) -> Response:
    """`respond` in Databricks' shape: a reasoning model's thinking as content blocks."""
    return await respond(models, req, blocks=True)


def _choice(runtime: Runtime, index: int, out: Collected, want_logprobs: bool, params: ChatParams, blocks: bool) -> Choice:
    fmt = runtime.thinking
    content, calls, reasoning = message_parts(out.text, fmt, params.sampling.thinking, params.output_parser())
    message = assistant_message(content, calls, reasoning, fmt is not None or params.thinks, blocks)
    return Choice(
        index=index,
        message=message,
        logprobs=chat_logprobs(runtime.tokenizer, out.logprobs) if want_logprobs else None,
        finish_reason=_finish_reason(out.finish_reason, bool(calls)),
        stop_reason=out.stop_reason,
    )


def _finish_reason(reason: FinishReason | None, called: bool) -> str | None:
    """"tool_calls" when the model stopped after calling tools."""
    if reason is None:
        return None
    return "tool_calls" if called and reason.value == "stop" else reason.value


def _stream(runtime: Runtime, gen: Generation, head: ChatCompletionChunk, req: ChatCompletionRequest, params: ChatParams, blocks: bool) -> Response:
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    if include_usage:
        head = msgspec.structs.replace(head, usage=None)
    sent_role: set[int] = set()
    finished: dict[int, Collected] = {}
    parsers: dict[int, StreamedMessage] = {}

    def chunk(index: int, delta: Delta, finish_reason: str | None = None, logprobs: ChatLogprobs | None = None) -> bytes:
        choice = ChunkChoice(index=index, delta=delta, logprobs=logprobs, finish_reason=finish_reason)
        return sse.data(msgspec.structs.replace(head, choices=[choice]))

    def render(index: int, delta: TextDelta) -> list[bytes]:
        out = []
        if index not in sent_role:
            sent_role.add(index)
            out.append(chunk(index, Delta(role="assistant", content="")))
        logprobs = chat_logprobs(runtime.tokenizer, delta.logprobs or []) if req.logprobs else None
        parser = parsers.get(index) or parsers.setdefault(index, StreamedMessage(runtime.thinking, params.sampling.thinking, params.output_parser(), blocks))
        pieces = parser.feed(delta.text)
        if delta.finish_reason is not None:
            pieces += parser.finish()
        if not pieces and logprobs and logprobs.content:
            pieces = [Delta(content="")]
        for k, piece in enumerate(pieces):
            out.append(chunk(index, piece, logprobs=logprobs if k == 0 else None))
        if delta.finish_reason is not None:
            out.append(chunk(index, Delta(), _finish_reason(delta.finish_reason, parser.called)))
            finished[index] = Collected(usage=delta.usage)
        return out

    def tail() -> list[bytes]:
        out = []
        if include_usage:
            usages = [u for i in sorted(finished) if (u := finished[i].usage) is not None]
            usage = chat_usage(usages, flat_reasoning=blocks and (runtime.thinking is not None or params.thinks))
            out.append(sse.data(msgspec.structs.replace(head, choices=[], usage=usage)))
        out.append(sse.DONE)
        return out

    return sse_stream(gen, render, tail)
