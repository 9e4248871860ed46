"""The tokenizer actor: prompts in, token ids out.

Owns: chat-template rendering, encoding, and the context-length rules (a prompt that does not
fit, or `max_tokens` past the context, fails the request with a 400 naming the field). Encoding
runs in a worker thread (behind a limiter) so a long prompt never blocks the event loop.
Imports trio, runtime and (through the tokenizer object) transformers.
"""

from __future__ import annotations

import random
from typing import Any

import trio

from actors.guidance import GuideCompiler
from runtime.errors import InvalidRequest
from runtime.logging import get_logger
from runtime.messages import TokenizedRequest
from runtime.request import Prompt, RequestContext

log = get_logger("tokenizer")


def encode_prompt(tokenizer: Any, prompt: Prompt) -> list[int]:
    if prompt.token_ids is not None:
        return list(prompt.token_ids)
    if prompt.messages is not None:
        try:
            text = tokenizer.apply_chat_template(
                prompt.messages, tokenize=False, add_generation_prompt=True, **prompt.chat_template_kwargs
            )
        except Exception as exc:  # jinja raises on messages the template rejects
            raise InvalidRequest(f"The chat template rejected these messages: {exc}", param="messages") from exc
        # The rendered template already holds BOS and role markers.
        return tokenizer.encode(text, add_special_tokens=False)
    assert prompt.text is not None
    return tokenizer.encode(prompt.text, add_special_tokens=prompt.add_special_tokens)


class TokenizerActor:
    def __init__(
        self,
        tokenizer: Any,
        max_model_len: int,
        inbox: trio.MemoryReceiveChannel[RequestContext],
        scheduler: trio.MemorySendChannel[Any],
        guides: GuideCompiler | None = None,
        task: str = "generate",
    ) -> None:
        self.task = task
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.guides = guides
        self.inbox = inbox
        self.scheduler = scheduler
        self._limiter = trio.CapacityLimiter(1)
        self._rng = random.Random()

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        if self.guides is not None:
            await trio.to_thread.run_sync(self.guides.warm)
        task_status.started()
        async with self.inbox, self.scheduler:
            async for ctx in self.inbox:
                if ctx.aborted:
                    continue
                try:
                    ids, matcher = await trio.to_thread.run_sync(self._prepare, ctx, limiter=self._limiter)
                    request = self._admit(ctx, ids)
                    request.matcher = matcher
                    forks = [self._fork(request, i, sibling) for i, sibling in enumerate(ctx.siblings, start=1)]
                except InvalidRequest as exc:
                    for c in (ctx, *ctx.siblings):
                        c.mailbox.fail(exc)
                    continue
                except Exception as exc:  # a tokenizer bug must fail one request, not the actor
                    log.exception("tokenize_failed", request_id=ctx.request_id)
                    for c in (ctx, *ctx.siblings):
                        c.mailbox.fail(InvalidRequest(f"Could not tokenize the prompt: {exc}", param="prompt"))
                    continue
                # Checked again right before each send: an abort that landed while we were
                # encoding must not reach the scheduler as a new request. send_nowait, with no
                # checkpoint in between, so a request and its siblings (n > 1) reach the
                # scheduler together and the step that finishes the prompt can fork them all;
                # the channel's bound (see Runtime.run) means it never refuses.
                for c, r in ((ctx, request), *zip(ctx.siblings, forks)):
                    if not c.aborted:
                        self.scheduler.send_nowait(r)

    def _fork(self, first: TokenizedRequest, index: int, sibling: RequestContext) -> TokenizedRequest:
        sibling.num_prompt_tokens = len(first.prompt_token_ids)
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
        )

    def _prepare(self, ctx: RequestContext) -> tuple[list[int], Any]:
        """Worker thread: encode the prompt and compile the request's grammar, if any."""
        if self.task == "embed":
            return self._encode_for_embedding(ctx), None
        ids = encode_prompt(self.tokenizer, ctx.prompt)
        guide = ctx.sampling.guide
        if guide is None:
            return ids, None
        if self.guides is None:
            raise InvalidRequest("Constrained decoding is not available for this model.", param=guide.param)
        return ids, self.guides.matcher(guide)

    def _encode_for_embedding(self, ctx: RequestContext) -> list[int]:
        # Like sentence-transformers: inputs past the model's max_seq_length are cut at the end
        # (special tokens kept), and the usage says how many tokens were dropped.
        prompt = ctx.prompt
        if prompt.token_ids is not None:
            ids = list(prompt.token_ids)
        else:
            ids = self.tokenizer.encode(prompt.text or "", add_special_tokens=True)
        if len(ids) > self.max_model_len:
            ctx.num_truncated_tokens = len(ids) - self.max_model_len
            ids = ids[: self.max_model_len - 1] + ids[-1:] if prompt.token_ids is None else ids[: self.max_model_len]
        return ids

    def _admit(self, ctx: RequestContext, ids: list[int]) -> TokenizedRequest:
        param = "messages" if ctx.prompt.messages is not None else "prompt"
        if not ids:
            raise InvalidRequest("The prompt is empty.", param=param)
        if self.task == "embed":
            ctx.num_prompt_tokens = len(ids)
            return TokenizedRequest(
                request_id=ctx.request_id, prompt_token_ids=ids, sampling=ctx.sampling, max_tokens=0, seed=0, arrival_time=ctx.arrival_time
            )
        if ctx.prompt.truncate:
            # error_behavior "truncate": keep the tail, leaving room for what is to be generated.
            wanted = ctx.sampling.max_tokens or min(256, self.max_model_len // 4)
            keep = max(1, self.max_model_len - min(wanted, self.max_model_len - 1))
            if len(ids) > keep:
                ctx.num_truncated_tokens = len(ids) - keep
                ids = ids[-keep:]
        num_prompt = len(ids)
        if num_prompt >= self.max_model_len:
            raise InvalidRequest(
                f"This model's maximum context length is {self.max_model_len} tokens; the prompt has {num_prompt}.",
                param=param,
                code="context_length_exceeded",
            )
        room = self.max_model_len - num_prompt
        max_tokens = ctx.sampling.max_tokens
        if max_tokens is None:
            max_tokens = room
        elif max_tokens > room:
            raise InvalidRequest(
                f"This model's maximum context length is {self.max_model_len} tokens; the prompt has "
                f"{num_prompt} and max_tokens asks for {max_tokens} more.",
                param="max_tokens",
                code="context_length_exceeded",
            )
        ctx.num_prompt_tokens = num_prompt
        seed = ctx.sampling.seed if ctx.sampling.seed is not None else self._rng.getrandbits(63)
        return TokenizedRequest(
            request_id=ctx.request_id,
            prompt_token_ids=ids,
            sampling=ctx.sampling,
            max_tokens=max_tokens,
            seed=seed,
            arrival_time=ctx.arrival_time,
        )
