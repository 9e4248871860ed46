"""The scheduler actor: the trio shell around `SchedulerCore`.

Owns: the step loop. Each turn it drains its inbox (new requests and aborts, in arrival order),
asks the core for a plan, hands it to the executor, waits for the result, drains the inbox
again (aborts land before `update`, so tokens of a request that left are dropped), applies the
result and forwards the new tokens to the detokenizer. One step is in flight at a time; while
it runs on the device thread the event loop is free for HTTP and detokenization.
`SchedulerInbox` is what the other actors and the runtime hold to send to it.

It holds no per-request state of its own and reads no other actor's: what it learns of a
request comes in its `TokenizedRequest` and `AbortRequest`s, and what the detokenizer needs
leaves in `StepOutputs` (the core's deltas, each request's first one registering it) and
`DropRequests` (requests the core aborted, so their decode state goes too).
Imports trio and runtime.
"""

from __future__ import annotations

import time

import trio

from actors.embed_core import EmbeddingSchedulerCore
from actors.sched_core import SchedulerCore
from runtime.logging import get_logger
from runtime.messages import AbortReason, AbortRequest, DropRequests, Shutdown, StepOutputs, StepPlan, StepResult, TokenizedRequest

log = get_logger("scheduler")

Inbound = TokenizedRequest | AbortRequest | Shutdown


class SchedulerInbox:
    """A sender's handle on the scheduler's bounded inbox; it never blocks the sender.

    Admission bounds live requests, but an aborted request leaves that count at once while its
    messages wait in the channel for the next step boundary, so clients that connect and leave
    during one long step can fill it. Then: a new request and its siblings (n > 1), which go
    in together or not at all (the step that finishes the prompt forks them all), are refused
    (`submit` is False: the caller answers 429); an abort is never lost but waits in
    `late_aborts`, shared with the scheduler, which applies it at its next drain (the full
    channel wakes it). Each actor holds its own clone of the channel, as trio wants, so the
    scheduler sees end-of-channel when the last sender closes.
    """

    def __init__(self, channel: trio.MemorySendChannel[Inbound], late_aborts: dict[str, AbortReason]) -> None:
        self.channel = channel
        self.late_aborts = late_aborts

    def clone(self) -> SchedulerInbox:
        return SchedulerInbox(self.channel.clone(), self.late_aborts)

    def submit(self, requests: list[TokenizedRequest]) -> bool:
        stats = self.channel.statistics()
        if stats.current_buffer_used + len(requests) > stats.max_buffer_size:
            return False
        for request in requests:
            self.channel.send_nowait(request)
        return True

    def abort(self, request_id: str, reason: AbortReason) -> None:
        """Raises trio.ClosedResourceError / BrokenResourceError once the scheduler is gone."""
        try:
            self.channel.send_nowait(AbortRequest(request_id, reason))
        except trio.WouldBlock:
            self.late_aborts[request_id] = reason

    def shutdown(self) -> bool:
        """Ask the scheduler to stop after its step in flight; False when it cannot be told."""
        try:
            self.channel.send_nowait(Shutdown())
        except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
            return False
        return True

    async def __aenter__(self) -> SchedulerInbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.channel.close()


class SchedulerActor:
    def __init__(
        self,
        core: SchedulerCore | EmbeddingSchedulerCore,
        inbox: trio.MemoryReceiveChannel[Inbound],
        plans: trio.MemorySendChannel[StepPlan],
        results: trio.MemoryReceiveChannel[StepResult],
        outputs: trio.MemorySendChannel[StepOutputs | DropRequests],
        late_aborts: dict[str, AbortReason],  # the senders' SchedulerInbox.late_aborts
    ) -> None:
        self.core = core
        self.inbox = inbox
        self.plans = plans
        self.results = results
        self.outputs = outputs
        self.num_steps = 0
        self.last_step_tokens = 0
        self.stopping = False  # a Shutdown arrived: no new step after the one in flight
        self.late_aborts = late_aborts  # see SchedulerInbox
        self._dropped: list[str] = []  # aborted since the last DropRequests went out

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async with self.inbox, self.plans, self.results, self.outputs:
            while True:
                if not self._drain() or self.stopping:
                    return
                if self._dropped:
                    dropped, self._dropped = self._dropped, []
                    await self.outputs.send(DropRequests(dropped))
                if not self.core.has_work:
                    try:
                        self._handle(await self.inbox.receive())
                    except trio.EndOfChannel:
                        return
                    continue
                plan = self.core.schedule()
                if plan is None:
                    # Work exists but none fits (every block is taken by requests that are not
                    # running, which admission rules out); wait for an abort or a new request.
                    log.warning("nothing_schedulable", **self.core.statistics())
                    try:
                        self._handle(await self.inbox.receive())
                    except trio.EndOfChannel:
                        return
                    continue
                await self._step(plan)

    async def _step(self, plan: StepPlan) -> None:
        started = time.perf_counter()
        await self.plans.send(plan)
        result = await self.results.receive()
        finished = time.perf_counter()
        log.debug("step", step_id=plan.step_id, decode_rows=plan.num_decode_rows, prompt_tokens=plan.num_prefill_tokens, ms=round((finished - started) * 1e3, 1))
        self._drain()
        items = self.core.update(plan, result, started, finished)
        self.num_steps += 1
        self.last_step_tokens = plan.num_tokens
        if items:
            await self.outputs.send(StepOutputs(step_id=plan.step_id, items=items))

    def _drain(self) -> bool:
        """Apply everything already in the inbox. False when the inbox is closed and empty."""
        is_open = True
        while True:
            try:
                self._handle(self.inbox.receive_nowait())
            except trio.WouldBlock:
                break
            except trio.EndOfChannel:
                is_open = False
                break
        # Late aborts after the channel: a request they name was sent (if at all) before its
        # abort was (the tokenizer never sends a request the runtime has marked aborted), so
        # it is in the core by now and the abort finds it.
        while self.late_aborts:
            self._abort(self.late_aborts.popitem()[0])
        return is_open or self.core.has_work

    def _handle(self, message: Inbound) -> None:
        if isinstance(message, AbortRequest):
            self._abort(message.request_id)
        elif isinstance(message, Shutdown):
            self.stopping = True
        else:
            self.core.add(message)

    def _abort(self, request_id: str) -> None:
        if self.core.abort(request_id):
            self._dropped.append(request_id)

    def statistics(self) -> dict[str, int]:
        return {**self.core.statistics(), "steps": self.num_steps, "inbox": self.inbox.statistics().current_buffer_used}
