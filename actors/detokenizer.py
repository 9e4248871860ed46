"""The detokenizer actor: token deltas in, text deltas out to each request's mailbox.

Owns: per-request incremental decoding (state lives on the request's context and dies with
it), stop strings (a hit finishes the request here and sends the scheduler an abort so its
blocks are freed), usage and the per-request log line at finish. It never blocks on a client:
mailboxes merge. Imports trio and runtime.
"""

from __future__ import annotations

import time
from typing import Any

import trio

from actors.detok_core import IncrementalDetokenizer
from actors.scheduler import SchedulerInbox
from runtime.errors import RequestFailed
from runtime.logging import get_logger
from runtime.messages import AbortReason, FinishReason, StepOutputs, TextDelta, TokenDelta, Usage
from runtime.request import RequestContext
from runtime.sampling import visible_tokens

log = get_logger("detokenizer")

# Yield to the event loop every this many requests, so a huge batch never starves HTTP.
_CHECKPOINT_EVERY = 64


class DetokenizerActor:
    def __init__(
        self,
        tokenizer: Any,  # tokenizers.Tokenizer
        eos_token_ids: frozenset[int],
        requests: dict[str, RequestContext],
        inbox: trio.MemoryReceiveChannel[StepOutputs],
        scheduler: SchedulerInbox,
        model_name: str,
    ) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.requests = requests
        self.inbox = inbox
        self.scheduler = scheduler
        self.model_name = model_name
        self.on_finish: list[Any] = []  # callbacks(ctx, delta) for metrics

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async with self.inbox:
            async for outputs in self.inbox:
                now = time.perf_counter()
                for i, item in enumerate(outputs.items):
                    ctx = self.requests.get(item.request_id)
                    if ctx is not None:
                        try:
                            self._apply(ctx, item, now)
                        except Exception as exc:  # one request's failure never takes the actor down
                            log.exception("detokenize_failed", request_id=ctx.request_id)
                            self._fail(ctx, f"detokenization failed: {exc}")
                    if i % _CHECKPOINT_EVERY == _CHECKPOINT_EVERY - 1:
                        await trio.lowlevel.checkpoint()

    def _apply(self, ctx: RequestContext, item: TokenDelta, now: float) -> None:
        if item.error is not None:
            self._fail(ctx, item.error)
            return
        if item.embedding is not None:
            self._finish_embedding(ctx, item, now)
            return
        params = ctx.sampling
        if ctx.detok is None:
            ctx.detok = IncrementalDetokenizer(
                self.tokenizer,
                skip_special_tokens=params.skip_special_tokens,
                stop=params.stop,
                include_stop_str_in_output=params.include_stop_str_in_output,
            )
            ctx.first_token_time = now
        self._count_tokens(ctx, item, now)

        finish = item.finish_reason
        stop_reason: str | int | None = item.stop_token_id
        tokens = visible_tokens(item.token_ids, params, finish is FinishReason.STOP, item.stop_token_id)
        text, hit = ctx.detok.push(tokens)
        if hit is not None:
            stop_reason = hit
            if finish is None:  # the scheduler still runs it: stop it there too
                self.scheduler.abort(ctx.request_id, AbortReason.STOP_STRING)
            finish = FinishReason.STOP
        elif finish is not None:
            text += ctx.detok.flush()

        usage = None
        if finish is not None:
            usage = Usage(
                prompt_tokens=ctx.num_prompt_tokens,
                completion_tokens=ctx.num_output_tokens,
                cached_tokens=ctx.num_cached_tokens,
                truncated_prompt_tokens=ctx.num_truncated_tokens,
                batch_size=ctx.batch_sizes,
                queue_wait_time=ctx.queue_wait_us,
            )
            self.requests.pop(ctx.request_id, None)
            self._log_finish(ctx, finish, now)
        ctx.mailbox.put(
            TextDelta(
                text=text,
                token_ids=item.token_ids,
                logprobs=item.logprobs,
                prompt_logprobs=item.prompt_logprobs,
                finish_reason=finish,
                stop_reason=stop_reason,
                usage=usage,
            )
        )

    def _finish_embedding(self, ctx: RequestContext, item: TokenDelta, now: float) -> None:
        ctx.first_token_time = now
        self.requests.pop(ctx.request_id, None)
        self._log_finish(ctx, FinishReason.STOP, now)
        usage = Usage(prompt_tokens=ctx.num_prompt_tokens, completion_tokens=0, truncated_prompt_tokens=ctx.num_truncated_tokens)
        ctx.mailbox.put(TextDelta(embedding=item.embedding, finish_reason=FinishReason.STOP, usage=usage))

    def _count_tokens(self, ctx: RequestContext, item: TokenDelta, now: float) -> None:
        n = len(item.token_ids)
        ctx.num_output_tokens += n
        since = ctx.last_token_time if ctx.last_token_time is not None else (ctx.scheduled_time or ctx.arrival_time)
        wait_us = int((now - since) * 1e6)
        ctx.batch_sizes.extend([item.batch_size] * n)
        ctx.queue_wait_us.extend([item.queue_wait_us] + [0] * (n - 1))
        ctx.token_wait_us.extend([wait_us] + [0] * (n - 1))
        ctx.last_token_time = now

    def _fail(self, ctx: RequestContext, message: str) -> None:
        self.requests.pop(ctx.request_id, None)
        ctx.mailbox.fail(RequestFailed(message))
        log.warning("request_failed", request_id=ctx.request_id, error=message)

    def _log_finish(self, ctx: RequestContext, finish: FinishReason, now: float) -> None:
        scheduled = ctx.scheduled_time if ctx.scheduled_time is not None else now
        first = ctx.first_token_time if ctx.first_token_time is not None else now
        log.info(
            "request_finished",
            request_id=ctx.request_id,
            model=self.model_name,
            prompt_tokens=ctx.num_prompt_tokens,
            completion_tokens=ctx.num_output_tokens,
            cached_tokens=ctx.num_cached_tokens,
            queue_time_s=round(scheduled - ctx.arrival_time, 6),
            time_to_first_token_s=round(first - ctx.arrival_time, 6),
            total_time_s=round(now - ctx.arrival_time, 6),
            finish_reason=finish.value,
        )
        for callback in self.on_finish:
            callback(ctx, finish, now)
