"""The detokenizer actor: token deltas in, text deltas out to each request's mailbox.

Owns: per-request incremental decoding, in its own `DecodeState`s (created from the
`RegisterRequest` on a request's first delta, gone at finish, failure or `DropRequests`; no
other actor holds them), stop strings (a hit finishes the request here and sends the scheduler
an abort so its blocks are freed), usage and the per-request log line at finish. It never
blocks on a client: mailboxes merge. Imports trio and runtime.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgspec
import trio

from actors.detok_core import IncrementalDetokenizer
from actors.scheduler import SchedulerInbox
from runtime.errors import RequestFailed
from runtime.logging import get_logger
from runtime.messages import AbortReason, DropRequests, FinishReason, StepOutputs, TextDelta, TokenDelta, Usage
from runtime.reasoning import ThinkingTracker
from runtime.request import DecodeState
from runtime.sampling import visible_tokens

log = get_logger("detokenizer")

# Yield to the event loop every this many requests, so a huge batch never starves HTTP.
_CHECKPOINT_EVERY = 64


class DetokenizerActor:
    def __init__(
        self,
        tokenizer: Any,  # tokenizers.Tokenizer
        eos_token_ids: frozenset[int],
        inbox: trio.MemoryReceiveChannel[StepOutputs | DropRequests],
        scheduler: SchedulerInbox,
        model_name: str,
        on_done: Callable[[str, Any], None] = lambda request_id, mailbox: None,
    ) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.requests: dict[str, DecodeState] = {}  # its own; nobody else reads or writes it
        self.inbox = inbox
        self.scheduler = scheduler
        self.model_name = model_name
        self.on_done = on_done  # (request id, mailbox) of each request it finished or failed
        self.on_finish: list[Any] = []  # callbacks(state, finish_reason, now) for metrics

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async with self.inbox:
            async for outputs in self.inbox:
                if isinstance(outputs, DropRequests):
                    for request_id in outputs.request_ids:
                        self.requests.pop(request_id, None)
                    continue
                now = time.perf_counter()
                for i, item in enumerate(outputs.items):
                    state = self._state(item)
                    if state is not None:
                        try:
                            self._apply(state, item, now)
                        except Exception as exc:  # one request's failure never takes the actor down
                            log.exception("detokenize_failed", request_id=state.request_id)
                            self._fail(state, f"detokenization failed: {exc}")
                    if i % _CHECKPOINT_EVERY == _CHECKPOINT_EVERY - 1:
                        await trio.lowlevel.checkpoint()

    def _state(self, item: TokenDelta) -> DecodeState | None:
        state = self.requests.get(item.request_id)
        if state is None and item.register is not None:
            state = self.requests[item.request_id] = DecodeState(start=item.register)
        return state

    def _apply(self, state: DecodeState, item: TokenDelta, now: float) -> None:
        if item.error is not None:
            self._fail(state, item.error)
            return
        if item.embedding is not None:
            self._finish_embedding(state, item, now)
            return
        params = state.start.sampling
        if state.detok is None:
            state.detok = IncrementalDetokenizer(
                self.tokenizer,
                skip_special_tokens=params.skip_special_tokens,
                stop=params.stop,
                include_stop_str_in_output=params.include_stop_str_in_output,
            )
            state.first_token_time = now
            if params.thinking is not None:
                state.thinking = ThinkingTracker(params.thinking)
        finish = item.finish_reason
        stop_reason: str | int | None = item.stop_token_id
        tokens = visible_tokens(item.token_ids, params, finish is FinishReason.STOP, item.stop_token_id)
        text, hit = state.detok.push(tokens)
        if hit is not None:
            # A stop string completed before the step's last token (inside a kept draft): the
            # output and its counts end at that token, as they would one token a step.
            taken = state.detok.num_taken
            item = msgspec.structs.replace(item, token_ids=item.token_ids[:taken], logprobs=item.logprobs[:taken] if item.logprobs is not None else None)
            stop_reason = hit
            if finish is None:  # the scheduler still runs it: stop it there too
                self.scheduler.abort(state.request_id, AbortReason.STOP_STRING)
            finish = FinishReason.STOP
        elif finish is not None:
            text += state.detok.flush()
        self._count_tokens(state, item, now)

        usage = None
        if finish is not None:
            usage = self._usage(state)
            self._forget(state)
            self._log_finish(state, finish, now)
        state.start.mailbox.put(
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

    def _finish_embedding(self, state: DecodeState, item: TokenDelta, now: float) -> None:
        state.first_token_time = now
        self._forget(state)
        self._log_finish(state, FinishReason.STOP, now)
        state.start.mailbox.put(TextDelta(embedding=item.embedding, finish_reason=FinishReason.STOP, usage=self._usage(state)))

    def _usage(self, state: DecodeState) -> Usage:
        """The prompt's counts come from the scheduler core (RegisterRequest), the rest are ours."""
        start = state.start
        return Usage(
            prompt_tokens=start.num_prompt_tokens,
            completion_tokens=state.num_output_tokens,
            cached_tokens=start.num_cached_tokens,
            truncated_prompt_tokens=start.num_truncated_tokens,
            reasoning_tokens=state.thinking.count if state.thinking is not None else 0,
            batch_size=state.batch_sizes,
            queue_wait_time=state.queue_wait_us,
        )

    def _count_tokens(self, state: DecodeState, item: TokenDelta, now: float) -> None:
        n = len(item.token_ids)
        state.num_output_tokens += n
        if state.thinking is not None:
            for token in item.token_ids:
                state.thinking.push(token)
        state.num_draft_tokens += item.num_draft_tokens
        state.num_accepted_tokens += item.num_accepted_tokens
        since = state.last_token_time if state.last_token_time is not None else state.start.scheduled_time
        wait_us = int((now - since) * 1e6)
        state.batch_sizes.extend([item.batch_size] * n)
        state.queue_wait_us.extend([item.queue_wait_us] + [0] * (n - 1))
        state.token_wait_us.extend([wait_us] + [0] * (n - 1))
        state.last_token_time = now

    def _forget(self, state: DecodeState) -> None:
        self.requests.pop(state.request_id, None)
        self.on_done(state.request_id, state.start.mailbox)

    def _fail(self, state: DecodeState, message: str) -> None:
        self._forget(state)
        # The client learns that it failed and under which id; what failed (a grammar's state,
        # an exception's text) goes to the log alone.
        public = f"The server could not finish this request (request id {state.request_id}); its log has the details."
        state.start.mailbox.fail(RequestFailed(public, usage=self._usage(state)))
        log.warning("request_failed", request_id=state.request_id, error=message)

    def _log_finish(self, state: DecodeState, finish: FinishReason, now: float) -> None:
        start = state.start
        first = state.first_token_time if state.first_token_time is not None else now
        log.info(
            "request_finished",
            request_id=state.request_id,
            model=self.model_name,
            prompt_tokens=start.num_prompt_tokens,
            completion_tokens=state.num_output_tokens,
            cached_tokens=start.num_cached_tokens,
            queue_time_s=round(start.scheduled_time - start.arrival_time, 6),
            time_to_first_token_s=round(first - start.arrival_time, 6),
            total_time_s=round(now - start.arrival_time, 6),
            finish_reason=finish.value,
            **({"spec_draft_tokens": state.num_draft_tokens, "spec_accepted_tokens": state.num_accepted_tokens} if state.num_draft_tokens else {}),
        )
        for callback in self.on_finish:
            callback(state, finish, now)
