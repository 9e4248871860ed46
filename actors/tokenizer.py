"""The tokenizer actor: prompts in, token ids out.

Owns: encoding each request's prompt (rendered and encoded by runtime/prompt_encoding.py, which
the serve-ray ingress shares, so its routing hashes match this cache's blocks), and the
context-length rules (a prompt that does not fit, or `max_tokens` past the context, fails the request with a 400 naming the field, unless
the prompt asks to be truncated: a text or token prompt keeps its tail, a message prompt drops
its oldest messages). Encoding runs in a worker thread, one request at a time and in arrival
order, so a long prompt never blocks the event loop. A request whose grammar is not compiled
yet is handed to a compile task instead (at most `compile_concurrency` at once, also in worker
threads) and reaches the scheduler when its matcher is ready, so one slow compilation holds up
neither the requests behind it that need none (they keep their order) nor other compilations.
It writes no request state: what it works out (token ids, resolved max_tokens and seed, the
tokens truncation dropped) leaves in the `TokenizedRequest`, and a request it cannot admit
is failed through its mailbox. Imports trio, msgspec, runtime and (through the tokenizer
object) transformers.
"""

from __future__ import annotations

import functools
import random
from typing import Any

import msgspec
import trio

from actors.guidance import GuideCompiler
from actors.multimodal import ImagePrompts
from actors.scheduler import SchedulerInbox
from runtime.context_window import fit_context, output_room
from runtime.errors import InvalidRequest, Overloaded, ServingError
from runtime.logging import get_logger
from runtime.messages import MultiModalPrompt, TokenizedRequest
from runtime.prompt_encoding import encode_messages, encode_prompt
from runtime.request import Prompt, RequestContext

log = get_logger("tokenizer")


def fit_messages(tokenizer: Any, prompt: Prompt, limit: int, prefix: str = "") -> tuple[list[int], int, int]:
    """A message prompt encoded in at most `limit` tokens by dropping its oldest messages
    (the Responses API's `truncation: "auto"`). Returns (ids, messages dropped, tokens the
    whole prompt had).

    Leading system messages (instructions, the tools block) and the last message always stay.
    The kept part starts at a message that can open a conversation: not a `tool` result, whose
    call would be gone. Encodings are searched by bisection, so a long history costs a few
    renderings, not one per message. When even the shortest candidate does not fit, it is
    returned as it is and the caller's context-length check refuses it. `prefix`: as in
    `encode_prompt`.
    """
    assert prompt.messages is not None
    messages, kwargs = prompt.messages, prompt.chat_template_kwargs
    ids = encode_messages(tokenizer, messages, kwargs, prefix)
    if len(ids) <= limit:
        return ids, 0, len(ids)
    head = 0
    while head < len(messages) - 1 and messages[head].get("role") in ("system", "developer"):
        head += 1
    starts = [i for i in range(head + 1, len(messages)) if messages[i].get("role") != "tool"]
    if not starts:
        return ids, 0, len(ids)
    best: tuple[list[int], int] | None = None
    lo, hi = 0, len(starts) - 1
    while lo <= hi:  # the fewest dropped messages that fit (fewer kept messages never encode longer)
        mid = (lo + hi) // 2
        kept = messages[:head] + messages[starts[mid] :]
        try:
            candidate = encode_messages(tokenizer, kept, kwargs, prefix)
        except InvalidRequest:  # the template refuses this cut (say, an assistant turn first)
            candidate = None
        if candidate is not None and len(candidate) <= limit:
            best, hi = (candidate, starts[mid] - head), mid - 1
        else:
            lo = mid + 1
    if best is None:  # the shortest candidate, for the caller to refuse
        best = encode_messages(tokenizer, messages[:head] + messages[starts[-1] :], kwargs, prefix), starts[-1] - head
    return best[0], best[1], len(ids)


class TokenizerActor:
    def __init__(
        self,
        tokenizer: Any,
        max_model_len: int,
        inbox: trio.MemoryReceiveChannel[RequestContext],
        scheduler: SchedulerInbox,
        guides: GuideCompiler | None = None,
        task: str = "generate",
        compile_concurrency: int = 2,
        images: ImagePrompts | None = None,
    ) -> None:
        self.images = images  # a vision-language model's processor: prompts with images
        self.task = task
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.guides = guides
        self.inbox = inbox
        self.scheduler = scheduler
        self._limiter = trio.CapacityLimiter(1)  # encoding: one request at a time, in order
        self._compile_limiter = trio.CapacityLimiter(compile_concurrency)
        self._rng = random.Random()

    async def encode(self, prompt: Prompt) -> list[int]:
        """A prompt's token ids, encoded as requests are (Runtime.encode: echo, beam search).
        In a worker thread, in turn with the requests' encoding."""
        return await trio.to_thread.run_sync(encode_prompt, self.tokenizer, prompt, limiter=self._limiter)

    async def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text of token ids (Runtime.decode), in a worker thread, in turn with the encoding."""
        decode = functools.partial(self.tokenizer.decode, token_ids, skip_special_tokens=skip_special_tokens)
        return await trio.to_thread.run_sync(decode, limiter=self._limiter)

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if self.guides is not None:
            await trio.to_thread.run_sync(self.guides.warm)
        task_status.started()
        # The nursery closes before the channels do: compilations still running at the end
        # send their requests first.
        async with self.inbox, self.scheduler, trio.open_nursery() as compiles:
            async for ctx in self.inbox:
                if ctx.aborted:
                    continue
                try:
                    ids, truncated, matcher, mm = await trio.to_thread.run_sync(self._prepare, ctx, limiter=self._limiter)
                    request = self._admit(ctx, ids, truncated, matcher, mm)
                except Exception as exc:
                    self._fail(ctx, exc)
                    continue
                guide = ctx.sampling.guide
                if guide is not None and matcher is None:  # not compiled yet: not in this line
                    compiles.start_soon(self._compile_and_send, ctx, request, guide)
                    continue
                self._send(ctx, request)

    async def _compile_and_send(self, ctx: RequestContext, request: TokenizedRequest, guide: Any) -> None:
        assert self.guides is not None
        async with self._compile_limiter:
            if all(c.aborted for c in (ctx, *ctx.siblings)):
                return
            try:
                matcher = await trio.to_thread.run_sync(self.guides.matcher, guide)
            except Exception as exc:
                self._fail(ctx, exc)
                return
        self._send(ctx, msgspec.structs.replace(request, matcher=matcher))

    def _send(self, ctx: RequestContext, request: TokenizedRequest) -> None:
        try:
            forks = [self._fork(request, i, sibling) for i, sibling in enumerate(ctx.siblings, start=1)]
        except Exception as exc:
            self._fail(ctx, exc)
            return
        # Checked again right before the send: an abort that landed while we were encoding (or
        # compiling) must not reach the scheduler as a new request. A request and its siblings
        # (n > 1) go in together, so the step that finishes the prompt can fork them all.
        group = [r for c, r in ((ctx, request), *zip(ctx.siblings, forks)) if not c.aborted]
        if group and not self.scheduler.submit(group):
            self._fail(ctx, Overloaded("The scheduler's inbox is full; retry shortly."))

    def _fail(self, ctx: RequestContext, exc: Exception) -> None:
        if not isinstance(exc, ServingError):  # a tokenizer bug must fail one request, not the actor
            log.exception("tokenize_failed", request_id=ctx.request_id)
            exc = InvalidRequest(f"Could not tokenize the prompt: {exc}", param="prompt")
        for c in (ctx, *ctx.siblings):
            c.mailbox.fail(exc)

    def _fork(self, first: TokenizedRequest, index: int, sibling: RequestContext) -> TokenizedRequest:
        matcher = first.matcher.deep_copy() if first.matcher is not None else None
        seed = (first.seed + index) % (1 << 63) if sibling.sampling.seed is not None else self._rng.getrandbits(63)
        return TokenizedRequest(
            request_id=sibling.request_id,
            prompt_token_ids=first.prompt_token_ids,
            sampling=sibling.sampling,
            max_tokens=first.max_tokens,
            seed=seed,
            arrival_time=sibling.arrival_time,
            matcher=matcher,
            fork_of=first.request_id,
            num_truncated_tokens=first.num_truncated_tokens,
            mailbox=sibling.mailbox,
            mm=first.mm,
        )

    def _prepare(self, ctx: RequestContext) -> tuple[list[int], int, Any, MultiModalPrompt | None]:
        """Worker thread: encode the prompt. Returns its ids, the tokens dropped to fit it (a
        message prompt that asked to be truncated), the request's matcher when its grammar
        is already compiled (None: no grammar, or one still to compile), and its images as the
        encoder takes them (a prompt with images: never truncated, its images and their
        tokens stay whole)."""
        if self.task == "embed":
            return *self._encode_for_embedding(ctx), None, None
        prompt, guide = ctx.prompt, ctx.sampling.guide
        prefix = guide.prefix if guide is not None else ""
        truncated = 0
        mm = None
        if prompt.images:
            if self.images is None or prompt.messages is None:
                raise InvalidRequest("This model reads text only; images are not supported.", param="messages", code="unsupported_content")
            ids, mm = self.images.encode(prompt, prefix)
        elif prompt.messages is not None and prompt.truncate:
            room = output_room(ctx.sampling.max_tokens, self.max_model_len)
            ids, dropped, full = fit_messages(self.tokenizer, prompt, self.max_model_len - room, prefix)
            if dropped:
                truncated = max(0, full - len(ids))
                log.info("prompt_truncated", request_id=ctx.request_id, messages_dropped=dropped, tokens=len(ids))
        else:
            ids = encode_prompt(self.tokenizer, prompt, prefix)
        if guide is None:
            return ids, truncated, None, mm
        if self.guides is None:
            raise InvalidRequest("Constrained decoding is not available for this model.", param=guide.param)
        return ids, truncated, self.guides.cached(guide), mm

    def _encode_for_embedding(self, ctx: RequestContext) -> tuple[list[int], int]:
        # Like sentence-transformers: inputs past the model's max_seq_length are cut at the end
        # (special tokens kept), and the usage says how many tokens were dropped.
        prompt = ctx.prompt
        if prompt.token_ids is not None:
            ids = list(prompt.token_ids)
        else:
            ids = self.tokenizer.encode(prompt.text or "", add_special_tokens=True)
        truncated = 0
        if len(ids) > self.max_model_len:
            truncated = len(ids) - self.max_model_len
            ids = ids[: self.max_model_len - 1] + ids[-1:] if prompt.token_ids is None else ids[: self.max_model_len]
        return ids, truncated

    def _admit(self, ctx: RequestContext, ids: list[int], truncated: int, matcher: Any, mm: MultiModalPrompt | None = None) -> TokenizedRequest:
        """The request for the scheduler; `truncated`: tokens already dropped in `_prepare`."""
        param = "messages" if ctx.prompt.messages is not None else "prompt"
        if not ids:
            raise InvalidRequest("The prompt is empty.", param=param)
        if self.task == "embed":
            return TokenizedRequest(
                request_id=ctx.request_id,
                prompt_token_ids=ids,
                sampling=ctx.sampling,
                max_tokens=0,
                seed=0,
                arrival_time=ctx.arrival_time,
                num_truncated_tokens=truncated,
                mailbox=ctx.mailbox,
            )
        # Chat prompts that are too long lose whole messages instead (fit_messages, above).
        ids, max_tokens, cut = fit_context(
            ids,
            ctx.sampling.max_tokens,
            self.max_model_len,
            truncate=ctx.prompt.truncate and ctx.prompt.messages is None and not ctx.prompt.images,
            param=param,
            max_tokens_param=ctx.sampling.max_tokens_param,
        )
        seed = ctx.sampling.seed if ctx.sampling.seed is not None else self._rng.getrandbits(63)
        return TokenizedRequest(
            request_id=ctx.request_id,
            prompt_token_ids=ids,
            sampling=ctx.sampling,
            max_tokens=max_tokens,
            seed=seed,
            arrival_time=ctx.arrival_time,
            matcher=matcher,
            num_truncated_tokens=cut or truncated,
            mailbox=ctx.mailbox,
            mm=mm,
        )
