"""The scheduler actor: the trio shell around `SchedulerCore`.

Owns: the step loop. Each turn it drains its inboxes (requests, then aborts), asks the core for
a plan, hands it to the executor, waits for the result, drains again (aborts land before
`update`, so tokens of a request that left are dropped), applies the result and forwards the
new tokens to the detokenizer. While a step runs on the device thread the event loop is free
for HTTP and detokenization. With async scheduling, while step N runs the core may already plan
step N+1 (actors/lookahead.py: decode-only continuations), which waits at the device so the
device never waits for the event loop; then two steps are in flight, applied in order.
`SchedulerInbox` is what the other actors and the runtime hold to send to it.

It holds no per-request state of its own and reads no other actor's: what it learns of a
request comes in its `TokenizedRequest` and `AbortRequest`s, and what the detokenizer needs
leaves in `StepOutputs` (the core's deltas, each request's first one registering it) and
`DropRequests` (requests the core aborted, so their decode state goes too).
Imports trio and runtime.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

import trio

from actors.embed_core import EmbeddingSchedulerCore
from actors.sched_core import SchedulerCore
from runtime.logging import get_logger
from runtime.messages import AbortReason, AbortRequest, DropRequests, Shutdown, StepOutputs, StepPlan, StepResult, TokenizedRequest

log = get_logger("scheduler")

Inbound = TokenizedRequest | Shutdown


class SchedulerInbox:
    """A sender's handle on the scheduler's two inboxes; neither ever blocks the sender.

    Requests (and `Shutdown`) go into a bounded channel; a new request and its siblings (n > 1),
    which go in together or not at all (the step that finishes the prompt forks them all), are
    refused when it has no room (`submit` is False: the caller answers 429). Aborts travel on
    a control channel of their own, which the scheduler drains first at every step boundary and
    which always has room: every live request can still send at most two aborts (its client
    leaving, a stop string), and the engine admits a request only while the control channel
    can take two more for it and for every live one (`can_admit`). An aborted request leaves
    admission's count at once while its abort waits for the boundary, so clients that come and
    go during one long step are refused with a 429, and no abort is ever dropped.
    Each actor holds its own clones of the channels, as trio wants, so the scheduler sees
    end-of-channel when the last sender closes.
    """

    ABORTS_PER_REQUEST = 2

    def __init__(self, channel: trio.MemorySendChannel[Inbound], aborts: trio.MemorySendChannel[AbortRequest]) -> None:
        self.channel = channel
        self.aborts = aborts

    def clone(self) -> SchedulerInbox:
        return SchedulerInbox(self.channel.clone(), self.aborts.clone())

    def submit(self, requests: list[TokenizedRequest]) -> bool:
        stats = self.channel.statistics()
        if stats.current_buffer_used + len(requests) > stats.max_buffer_size:
            return False
        for request in requests:
            self.channel.send_nowait(request)
        return True

    def can_admit(self, live: int, n: int) -> bool:
        """Whether the control channel has room for the aborts `live` + `n` requests may send."""
        stats = self.aborts.statistics()
        return stats.current_buffer_used + self.ABORTS_PER_REQUEST * (live + n) <= stats.max_buffer_size

    def abort(self, request_id: str, reason: AbortReason) -> None:
        """Raises trio.ClosedResourceError / BrokenResourceError once the scheduler is gone."""
        self.aborts.send_nowait(AbortRequest(request_id, reason))  # never full: see can_admit

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
        self.aborts.close()


class SchedulerActor:
    def __init__(
        self,
        core: SchedulerCore | EmbeddingSchedulerCore,
        inbox: trio.MemoryReceiveChannel[Inbound],
        plans: trio.MemorySendChannel[StepPlan],
        results: trio.MemoryReceiveChannel[StepResult],
        outputs: trio.MemorySendChannel[StepOutputs | DropRequests],
        aborts: trio.MemoryReceiveChannel[AbortRequest],  # the control channel (SchedulerInbox)
        async_scheduling: bool = False,
    ) -> None:
        self.core = core
        self.inbox = inbox
        self.plans = plans
        self.results = results
        self.outputs = outputs
        self.num_steps = 0
        self.num_steps_ahead = 0  # planned while the step before them ran
        self.last_step_tokens = 0
        self.stopping = False  # a Shutdown arrived: no new step after the one in flight
        self.aborts = aborts
        self._woken: list[Inbound | AbortRequest] = []  # what ended the last wait, not applied yet
        self._dropped: list[str] = []  # aborted since the last DropRequests went out
        # Steps handed to the executor and not applied yet, oldest first, with when each was
        # sent: one, or two while the next is planned ahead of the one running.
        self.in_flight: deque[tuple[StepPlan, float]] = deque()
        self._last_finished = 0.0
        self.plan_ahead = getattr(core, "schedule_ahead", None) if async_scheduling else None

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async with self.inbox, self.aborts, self.plans, self.results, self.outputs:
            while True:
                if not self.in_flight:
                    if not self._drain() or self.stopping:
                        return
                    await self._send_dropped()
                    if not self.core.has_work:
                        if not await self._wait_for_message():
                            return
                        continue
                    plan = self.core.schedule()
                    if plan is None:
                        # Work exists but none fits (every block is taken by requests that are
                        # not running, which admission rules out); wait for an abort or a new request.
                        log.warning("nothing_schedulable", **self.core.statistics())
                        if not await self._wait_for_message():
                            return
                        continue
                    await self._send(plan)
                if self.plan_ahead is not None and len(self.in_flight) == 1 and not self.stopping:
                    ahead = self.plan_ahead(self.in_flight[0][0])
                    if ahead is not None:
                        self.num_steps_ahead += 1
                        await self._send(ahead)
                await self._apply_oldest()

    async def _send(self, plan: StepPlan) -> None:
        self.in_flight.append((plan, time.perf_counter()))
        await self.plans.send(plan)

    async def _apply_oldest(self) -> None:
        """Wait for the oldest step's result, apply it, forward what it produced."""
        result = await self.results.receive()
        plan, sent = self.in_flight.popleft()
        finished = time.perf_counter()
        started = max(sent, self._last_finished)  # a step planned ahead starts when the one before it ends
        self._last_finished = finished
        log.debug(
            "step", step_id=plan.step_id, decode_rows=plan.num_decode_rows, prompt_tokens=plan.num_prefill_tokens, ms=round((finished - started) * 1e3, 1),
            runner_ms=round(result.elapsed * 1e3, 1), encoder_ms=round(result.encoder_s * 1e3, 1),
            **self._fit_fields(plan),
        )  # fmt: skip
        self._drain()
        items = self.core.update(plan, result, started, finished)
        self.num_steps += 1
        self.last_step_tokens = plan.num_tokens
        if items:
            await self.outputs.send(StepOutputs(step_id=plan.step_id, items=items))
        await self._send_dropped()

    def _fit_fields(self, plan: StepPlan) -> dict[str, object]:
        """What the step cost fit that planned this step expected of it (the log's debug line
        only: how far the fit is off mixed steps decides how many prompt tokens ride beside the
        streams, actors/step_cost.py). Nothing at other levels: it runs every step."""
        if not isinstance(self.core, SchedulerCore) or not log.is_enabled_for(logging.DEBUG):
            return {}  # embeddings (no streams, no fit), or the line is not logged
        fit = self.core.step_cost
        predicted = fit.predict(plan.num_decode_rows, plan.num_prefill_tokens)
        return {"predicted_ms": None if predicted is None else round(predicted * 1e3, 1), "fit_ms": fit.coefficients_ms()}

    async def _send_dropped(self) -> None:
        if self._dropped:
            dropped, self._dropped = self._dropped, []
            await self.outputs.send(DropRequests(dropped))

    async def _wait_for_message(self) -> bool:
        """Sleep until a request, a Shutdown or an abort arrives. What woke it is kept for the
        next `_drain`, which applies it in the usual order (requests before aborts: both
        channels may have woken at once). False once the request inbox has closed."""
        inbox_open = True

        async def wait(channel: trio.MemoryReceiveChannel[Any], nursery: trio.Nursery) -> None:
            nonlocal inbox_open
            try:
                self._woken.append(await channel.receive())
            except trio.EndOfChannel:
                if channel is not self.inbox:
                    await trio.sleep_forever()  # the control channel closed first: wait on the inbox
                inbox_open = False
            nursery.cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait, self.inbox, nursery)
            nursery.start_soon(wait, self.aborts, nursery)
        return inbox_open or bool(self._woken)

    def _drain(self) -> bool:
        """Apply everything already in the inboxes. False when the request inbox is closed and empty.

        Requests first, then aborts: a request an abort names was sent (if at all) before its
        abort was (the tokenizer never sends a request the engine has marked aborted, and
        checks it in the same synchronous turn as the send), so it is in the core by now and
        the abort finds it.
        """
        woken, self._woken = self._woken, []
        for message in woken:
            if not isinstance(message, AbortRequest):
                self._handle(message)
        is_open = True
        while True:
            try:
                self._handle(self.inbox.receive_nowait())
            except trio.WouldBlock:
                break
            except trio.EndOfChannel:
                is_open = False
                break
        for message in woken:
            if isinstance(message, AbortRequest):
                self._abort(message.request_id)
        while True:
            try:
                self._abort(self.aborts.receive_nowait().request_id)
            except (trio.WouldBlock, trio.EndOfChannel):
                break
        return is_open or self.core.has_work

    def _handle(self, message: Inbound) -> None:
        if isinstance(message, Shutdown):
            self.stopping = True
        else:
            self.core.add(message)

    def _abort(self, request_id: str) -> None:
        if self.core.abort(request_id):
            self._dropped.append(request_id)

    def statistics(self) -> dict[str, int]:
        inbox = self.inbox.statistics().current_buffer_used + self.aborts.statistics().current_buffer_used
        return {**self.core.statistics(), "steps": self.num_steps, "steps_ahead": self.num_steps_ahead, "inbox": inbox}
