"""POST /v1/chat/completions: decode → params → runtime → one JSON body or an SSE stream."""

from __future__ import annotations

import time
from typing import Any

from quart import Quart, Response

from api.http.openai.grammars import validated
from api.http.openai.logprobs import chat_logprobs
from api.http.openai.params import chat_params, chat_tools
from api.http.openai.schemas import ChatCompletionRequest
from api.http.openai.streaming import Collected, Generation, sse_stream
from api.http.openai.tools.chat import ChatDeltas, chat_message_parts
from api.http.openai.tools.parser import output_prefix
from api.http.openai.tools.prompt import template_takes_tools
from api.http.openai.tools.spec import ToolSet
from api.http.openai.usage import usage_dict
from api.http.shared import sse
from api.http.shared.body import decode_body
from api.http.shared.errors import json_response
from api.http.shared.routes import bind
from runtime.messages import TextDelta, Usage
from runtime.protocol import Runtime
from runtime.registry import ModelRegistry


def register(app: Quart, models: ModelRegistry) -> None:
    async def chat_completions() -> Response:
        return await respond(models, await decode_body(ChatCompletionRequest))

    bind(app, "chat_completions", chat_completions, ChatCompletionRequest)


async def respond(models: ModelRegistry, req: ChatCompletionRequest) -> Response:
    """A decoded chat request → its JSON body or SSE stream (also what Azure ML's and Databricks'
    chat routes answer with: create_app hands it to them)."""
    runtime = models.resolve(req.model)
    template_tools = template_takes_tools(runtime.tokenizer)
    prompt, sampling = await validated(chat_params, req, template_tools, compiles=bool(req.tools or req.response_format))
    toolset = chat_tools(req)
    toolset = toolset if toolset is not None and toolset.callable() else None
    gen = await Generation(runtime, [prompt], sampling, sampling.n).start()
    head = {
        "id": f"chatcmpl-{gen.request_id}",
        "created": int(time.time()),
        "model": runtime.served_name,
        "system_fingerprint": runtime.fingerprint,
    }
    if req.stream:
        return _stream(runtime, gen, head, req, toolset, output_prefix(sampling))
    outs = await gen.collect()
    choices = [_choice(runtime, i, out, req.logprobs, toolset, output_prefix(sampling)) for i, out in enumerate(outs)]
    return json_response({**head, "object": "chat.completion", "choices": choices, "usage": chat_usage(outs)})


def _choice(runtime: Runtime, index: int, out: Collected, want_logprobs: bool, toolset: ToolSet | None = None, prefix: str = "") -> dict[str, Any]:
    content, calls = chat_message_parts(out.text, toolset, prefix) if toolset is not None else (out.text, [])
    message = {"role": "assistant", "content": content, "refusal": None, "tool_calls": calls or None}
    return {
        "index": index,
        "message": message,
        "logprobs": chat_logprobs(runtime.tokenizer, out.logprobs) if want_logprobs else None,
        "finish_reason": _finish_reason(out.finish_reason, bool(calls)),
        "stop_reason": out.stop_reason,
    }


def chat_usage(outs: list[Collected]) -> dict[str, Any] | None:
    usages: list[Usage] = [o.usage for o in outs if o.usage is not None]
    if not usages:
        return None
    body = usage_dict(usages[0]) or {}
    completion = sum(u.completion_tokens for u in usages)
    body.update(completion_tokens=completion, total_tokens=body["prompt_tokens"] + completion)
    # No served model has a thinking template yet, so no completion token is a reasoning token.
    body["completion_tokens_details"] = {"reasoning_tokens": 0}
    return body


def _finish_reason(reason: Any, called: bool) -> str | None:
    """"tool_calls" when the model stopped after calling tools."""
    if reason is None:
        return None
    return "tool_calls" if called and reason.value == "stop" else reason.value


def _stream(
    runtime: Runtime, gen: Generation, head: dict[str, Any], req: ChatCompletionRequest, toolset: ToolSet | None = None, prefix: str = ""
) -> Response:
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    head = {**head, "object": "chat.completion.chunk"}
    if include_usage:
        head["usage"] = None
    sent_role: set[int] = set()
    finished: dict[int, Collected] = {}
    tools: dict[int, ChatDeltas] = {}

    def chunk(index: int, delta: dict[str, Any], finish_reason: str | None = None, logprobs: Any = None) -> bytes:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        return sse.data({**head, "choices": [choice]})

    def render(index: int, delta: TextDelta) -> list[bytes]:
        out = []
        if index not in sent_role:
            sent_role.add(index)
            out.append(chunk(index, {"role": "assistant", "content": ""}))
        logprobs = chat_logprobs(runtime.tokenizer, delta.logprobs or []) if req.logprobs else None
        parser = tools.setdefault(index, ChatDeltas(toolset, prefix)) if toolset is not None else None
        pieces = parser.feed(delta.text) if parser is not None else [{"content": delta.text}] if delta.text else []
        if parser is not None and delta.finish_reason is not None:
            pieces += parser.finish()
        if not pieces and logprobs and logprobs["content"]:
            pieces = [{"content": ""}]
        for k, piece in enumerate(pieces):
            out.append(chunk(index, piece, logprobs=logprobs if k == 0 else None))
        if delta.finish_reason is not None:
            out.append(chunk(index, {}, _finish_reason(delta.finish_reason, parser is not None and parser.called)))
            finished[index] = Collected(usage=delta.usage)
        return out

    def tail() -> list[bytes]:
        out = []
        if include_usage:
            outs = [finished[i] for i in sorted(finished)]
            out.append(sse.data({**head, "choices": [], "usage": chat_usage(outs)}))
        out.append(sse.DONE)
        return out

    return sse_stream(gen, render, tail)
