"""POST /v1/completions: legacy text completions (the Databricks Foundation Model API's and
MindIE Server's), streaming or not; its body a `Completion`.

A batch of prompts × n (or best_of) sequences runs as one group. best_of > n returns the n
sequences with the highest cumulative logprob. echo prepends the prompt (with its logprobs when
`logprobs` is set), suffix appends. use_beam_search runs completions/beam.py instead. `respond`
is also what Databricks' completions invocations answer with. Choice `index` is
prompt_index * n + i and `text_offset` counts from the start of the choice's own `text` (where
the references disagree: docs/api-notes.md, and the comment above `_choice`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Sequence

import msgspec
import trio
from quart import Quart, Response

from api.http.openai.common.generation import Collected, Generation, sse_stream
from api.http.openai.common.logprobs import LegacyLogprobs, legacy_logprobs
from api.http.openai.common.usage import CompletionUsage, completion_usage
from api.http.openai.completions.beam import BeamSearch, unwrapped_errors
from api.http.openai.completions.params import completion_params
from api.http.openai.completions.request import CompletionRequest
from api.http.openai.completions.response import Completion, CompletionChoice
from api.http.shared import sse
from api.http.shared.body import decode_body
from api.http.shared.errors import json_response
from api.http.shared.routes import bind
from runtime.context_window import fit_context
from runtime.messages import Logprob, TextDelta, Usage
from runtime.protocol import Runtime
from runtime.registry import ModelRegistry
from runtime.request import Prompt
from runtime.sampling import SamplingParams, visible_tokens


def register(app: Quart, models: ModelRegistry) -> None:
    async def completions() -> Response:
        return await respond(models, await decode_body(CompletionRequest))

    bind(app, "completions", completions, CompletionRequest)


async def respond(models: ModelRegistry, req: CompletionRequest) -> Response:
    """A decoded completions request → its JSON body or SSE stream."""
    runtime = models.resolve(req.model)
    prompts, sampling = completion_params(req, runtime.sampling_defaults)
    if req.use_beam_search:
        return await _beam_search(runtime, req, prompts, sampling)
    gen = await Generation(runtime, prompts, sampling, sampling.n).start()
    head = _head(runtime, f"cmpl-{gen.request_id}")
    per_prompt = sampling.n
    if req.stream:
        # A stream echoes the whole prompt: it starts before usage says what was truncated.
        return _stream(runtime, gen, req, head, await _echoes(runtime, req, prompts, [None] * len(prompts)), per_prompt)
    outs = await gen.collect()
    echoes = await _echoes(runtime, req, prompts, outs[::per_prompt])
    choices = []
    for p in range(len(prompts)):
        group = outs[p * per_prompt : (p + 1) * per_prompt]
        if per_prompt > req.n:  # best_of: keep the n most likely, best first
            group = sorted(group, key=lambda o: o.cumulative_logprob, reverse=True)[: req.n]
        for i, out in enumerate(group):
            choices.append(_choice(runtime, req, p * req.n + i, out, echoes[p]))
    return json_response(msgspec.structs.replace(head, choices=choices, usage=_usage(outs, per_prompt)))


async def _beam_search(runtime: Runtime, req: CompletionRequest, prompts: list[Prompt], sampling: SamplingParams) -> Response:
    """Beam search (completions/beam.py), one search per prompt, concurrently. The beams are
    only known at the end: a stream sends them all in one chunk, usage included (as MindIE's
    example does)."""
    collected: list[list[Collected]] = [[] for _ in prompts]

    async def one(p: int) -> None:
        prompt = prompts[p]
        ids, max_tokens, truncated = fit_context(
            await runtime.encode(prompt), sampling.max_tokens, runtime.max_model_len, truncate=prompt.truncate, max_tokens_param=sampling.max_tokens_param
        )
        search = BeamSearch(runtime, ids, sampling.n, max_tokens, sampling)
        for beam in (await search.run())[: req.n]:
            tokens = visible_tokens(beam.tokens, sampling, beam.finished, beam.stop_token_id)
            usage = Usage(
                prompt_tokens=len(ids),
                completion_tokens=len(beam.tokens),
                cached_tokens=search.cached_tokens,
                truncated_prompt_tokens=truncated,
                batch_size=beam.batch_size,
                queue_wait_time=beam.queue_wait_time,
            )
            collected[p].append(
                Collected(
                    text=await runtime.decode(tokens, sampling.skip_special_tokens),
                    token_ids=beam.tokens,
                    logprobs=beam.logprobs,
                    prompt_logprobs=search.prompt_logprobs,
                    finish_reason=beam.finish_reason,
                    stop_reason=beam.stop_token_id,
                    usage=usage,
                )
            )

    async with unwrapped_errors(), trio.open_nursery() as nursery:
        for p in range(len(prompts)):
            nursery.start_soon(one, p)
    echoes = await _echoes(runtime, req, prompts, [group[0] if group else None for group in collected])
    choices = [
        _choice(runtime, req, p * req.n + i, out, echoes[p]) for p, outs in enumerate(collected) for i, out in enumerate(outs)
    ]
    outs = [out for group in collected for out in group]
    body = msgspec.structs.replace(_head(runtime, f"cmpl-beam-{uuid.uuid4().hex[:16]}"), choices=choices, usage=_usage(outs, req.n))
    if not req.stream:
        return json_response(body)

    async def events() -> AsyncIterator[bytes]:
        yield sse.data(body)
        yield sse.DONE

    return sse.response(events())


def _head(runtime: Runtime, completion_id: str) -> Completion:
    return Completion(id=completion_id, created=int(time.time()), model=runtime.served_name, system_fingerprint=runtime.fingerprint, choices=[])


Echo = tuple[str, list[int]]  # what echo prepends to a prompt's choices: text and token ids


async def _echoes(runtime: Runtime, req: CompletionRequest, prompts: list[Prompt], firsts: Sequence[Collected | None]) -> list[Echo]:
    """Per prompt, the prompt as the model read it (error_behavior "truncate": the kept tail,
    as the usage of its first output `firsts[p]` says), or nothing without echo. Encoded and
    decoded by the runtime's tokenizer actor, off the event loop."""
    echoes: list[Echo] = []
    for prompt, first in zip(prompts, firsts):
        if not req.echo:
            echoes.append(("", []))
            continue
        ids = list(prompt.token_ids) if prompt.token_ids is not None else await runtime.encode(prompt)
        truncated = first.usage.truncated_prompt_tokens if first is not None and first.usage is not None else 0
        ids = ids[truncated:]
        text = prompt.text if prompt.text is not None and not truncated else await runtime.decode(ids, False)
        echoes.append((text, ids))
    return echoes


# Choice `index` is prompt_index * n + i, a decision between the references: the Databricks
# reference calls CompletionChoice.index "the index of the prompt in the request", MindIE's "the
# choice's position in the list" (its n=2 examples number one prompt's choices 0 and 1), OpenAI
# prompt_index * n + i. With n = 1 all three agree. With n > 1 the prompt index alone would give
# one prompt's choices the same index, which contradicts MindIE's examples and leaves a streaming
# client (the openai SDK yields chunks that carry only `index`) unable to tell the choices apart.
# `text_offset` counts from the start of the choice's own `text` (the echoed prompt included), so
# text[offset:].startswith(token) for every token; MindIE's n=2 examples continue the offsets
# from one choice to the next, which breaks finding a token in its choice's text by its offset
# (OpenAI and vLLM offsets are per choice).
def _choice(runtime: Runtime, req: CompletionRequest, index: int, out: Collected, echo: Echo) -> CompletionChoice:
    echo_text, echo_ids = echo
    text = echo_text + out.text + (req.suffix or "")
    logprobs = None
    if req.logprobs is not None:
        entries: list[Logprob | None] = []
        ids: list[int] = []
        if req.echo:
            entries = [None, *(out.prompt_logprobs or [])][: len(echo_ids)]
            entries += [None] * (len(echo_ids) - len(entries))
            ids = list(echo_ids)  # the prompt's choices share its echo
        entries += list(out.logprobs)
        ids += [e.token_id for e in out.logprobs]
        logprobs = legacy_logprobs(runtime.tokenizer, entries, ids)
    finish = out.finish_reason.value if out.finish_reason else None
    return CompletionChoice(index=index, text=text, logprobs=logprobs, finish_reason=finish, stop_reason=out.stop_reason)


def _usage(outs: list[Collected], per_prompt: int) -> CompletionUsage | None:
    return completion_usage([o.usage for o in outs if o.usage is not None], per_prompt)


def _stream(runtime: Runtime, gen: Generation, req: CompletionRequest, head: Completion, echoes: list[Echo], per_prompt: int) -> Response:
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    if include_usage:
        head = msgspec.structs.replace(head, usage=None)
    finished: dict[int, Collected] = {}
    started: set[int] = set()
    offsets: dict[int, int] = {}

    def render(index: int, delta: TextDelta) -> list[bytes]:
        text = delta.text
        entries: list[Logprob | None] = list(delta.logprobs or [])
        ids = [e.token_id for e in delta.logprobs or []]
        if index not in started:
            started.add(index)
            if req.echo:
                echo_text, echo_ids = echoes[index // per_prompt]
                text = echo_text + text
                if req.logprobs is not None:
                    echo_entries = [None, *(delta.prompt_logprobs or [])][: len(echo_ids)]
                    entries = echo_entries + [None] * (len(echo_ids) - len(echo_entries)) + entries
                    ids = echo_ids + ids
        finish = delta.finish_reason.value if delta.finish_reason is not None else None
        if finish is not None:
            text += req.suffix or ""
            finished[index] = Collected(usage=delta.usage)
        if not text and finish is None and not ids:
            return []  # nothing to say yet (text held back, no logprobs asked)
        logprobs: LegacyLogprobs | None = None
        if req.logprobs is not None:
            logprobs = legacy_logprobs(runtime.tokenizer, entries, ids, offsets.get(index, 0))
            offsets[index] = offsets.get(index, 0) + sum(len(t) for t in logprobs.tokens)
        choice = CompletionChoice(index=index, text=text, logprobs=logprobs, finish_reason=finish, stop_reason=delta.stop_reason if finish else None)
        return [sse.data(msgspec.structs.replace(head, choices=[choice]))]

    def tail() -> list[bytes]:
        out = []
        if include_usage:
            outs = [finished[i] for i in sorted(finished)]
            out.append(sse.data(msgspec.structs.replace(head, choices=[], usage=_usage(outs, req.n))))
        out.append(sse.DONE)
        return out

    return sse_stream(gen, render, tail)
