"""The scheduler actor: the trio shell around `SchedulerCore`.

Owns: the step loop. Each turn it drains its inbox (new requests and aborts, in arrival order),
asks the core for a plan, hands it to the executor, waits for the result, drains the inbox
again (aborts land before `update`, so tokens of a request that left are dropped), applies the
result and forwards the new tokens to the detokenizer. One step is in flight at a time; while
it runs on the device thread the event loop is free for HTTP and detokenization.
Imports trio and runtime.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import trio

from actors.sched_core import SchedulerCore
from runtime.logging import get_logger
from runtime.messages import AbortRequest, Shutdown, StepOutputs, StepPlan, StepResult, TokenDelta, TokenizedRequest
from runtime.request import RequestContext

log = get_logger("scheduler")

Inbound = TokenizedRequest | AbortRequest | Shutdown


class SchedulerActor:
    def __init__(
        self,
        core: SchedulerCore,
        inbox: trio.MemoryReceiveChannel[Inbound],
        plans: trio.MemorySendChannel[StepPlan],
        results: trio.MemoryReceiveChannel[StepResult],
        outputs: trio.MemorySendChannel[StepOutputs],
        requests: Mapping[str, RequestContext],
    ) -> None:
        self.core = core
        self.inbox = inbox
        self.plans = plans
        self.results = results
        self.outputs = outputs
        self.requests = requests
        self.num_steps = 0
        self.last_step_tokens = 0
        self.stopping = False  # a Shutdown arrived: no new step after the one in flight

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async with self.inbox, self.plans, self.results, self.outputs:
            while True:
                if not self._drain() or self.stopping:
                    return
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
        for item in plan.seqs:
            ctx = self.requests.get(item.request_id)
            if ctx is not None and ctx.scheduled_time is None:
                ctx.scheduled_time = started
                ctx.num_cached_tokens = item.start_pos  # a first chunk starts past the cached prefix
        await self.plans.send(plan)
        result = await self.results.receive()
        finished = time.perf_counter()
        self._drain()
        items = self.core.update(plan, result)
        self.num_steps += 1
        self.last_step_tokens = plan.num_tokens
        if items:
            self._stamp_queue_waits(items, started, finished)
            await self.outputs.send(StepOutputs(step_id=plan.step_id, items=items))

    def _stamp_queue_waits(self, items: list[TokenDelta], started: float, finished: float) -> None:
        """How long each request waited for this step: since arrival until its first step for
        its first token, since the end of its previous step after that (seed 004)."""
        for item in items:
            ctx = self.requests.get(item.request_id)
            if ctx is None:
                continue
            if ctx.ready_time is None:  # first token (a forked sibling is first scheduled now)
                if ctx.scheduled_time is None:
                    ctx.scheduled_time = started
                wait = ctx.scheduled_time - ctx.arrival_time
            else:
                wait = started - ctx.ready_time
            item.queue_wait_us = max(0, int(wait * 1e6))
            ctx.ready_time = finished

    def _drain(self) -> bool:
        """Apply everything already in the inbox. False when the inbox is closed and empty."""
        while True:
            try:
                self._handle(self.inbox.receive_nowait())
            except trio.WouldBlock:
                return True
            except trio.EndOfChannel:
                return self.core.has_work

    def _handle(self, message: Inbound) -> None:
        if isinstance(message, AbortRequest):
            self.core.abort(message.request_id)
        elif isinstance(message, Shutdown):
            self.stopping = True
        else:
            ctx = self.requests.get(message.request_id)
            if ctx is None or ctx.aborted:
                return
            self.core.add(message)

    def statistics(self) -> dict[str, int]:
        return {**self.core.statistics(), "steps": self.num_steps, "inbox": self.inbox.statistics().current_buffer_used}
