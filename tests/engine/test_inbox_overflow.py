"""Clients that come and go during one long step cannot overflow the scheduler's inbox.

Admission counts live requests, and an aborted request leaves that count at once while its
request and abort messages wait in the scheduler's bounded inboxes until the step in flight
ends. Before SchedulerInbox, the tokenizer's send_nowait then raised WouldBlock and took the
whole model down. Now: new requests that find no room get a 429 (Overloaded), every abort waits
on the control channel (the engine admits only while it has room for them all) and is applied
at the next drain, and the model serves on with every block free.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from runtime.config import RuntimeConfig
from runtime.errors import Overloaded
from runtime.request import Prompt
from runtime.sampling import SamplingParams
from tests.support.fakes import fake_runtime
from tests.support.waiting import wait_idle, wait_until


def refused(stream) -> bool:  # type: ignore[no-untyped-def]
    try:
        stream.ctx.mailbox.take_nowait()
    except Overloaded:
        return True
    return False


async def test_requests_that_leave_during_a_held_step_neither_crash_nor_leak(tiny_model_dir: Path) -> None:
    runtime = fake_runtime(tiny_model_dir, RuntimeConfig(served_name="fake", port=0, max_pending=2))
    runner = runtime.runner
    async with trio.open_nursery() as nursery:
        await nursery.start(runtime.run)
        inbox = runtime._scheduler_inbox.channel  # noqa: SLF001 - what the test is about
        capacity = inbox.statistics().max_buffer_size

        runner.release.clear()  # the next step stays on the device until the test lets it go
        keeper = runtime.open(Prompt(token_ids=[5, 6, 7]), SamplingParams(max_tokens=3, ignore_eos=True))
        await wait_until(lambda: runner.num_steps >= 1)

        num_refused = num_admitted = 0
        for i in range(2 * capacity):
            try:
                stream = runtime.open(Prompt(token_ids=[5, 6, 8 + i]), SamplingParams(max_tokens=3))
            except Overloaded:  # refused at the door: the control channel has no room for its aborts
                num_refused += 1
                continue
            num_admitted += 1
            # wait until the tokenizer has dealt with it: forwarded (inbox grew) or refused
            before = inbox.statistics().current_buffer_used
            await wait_until(lambda: inbox.statistics().current_buffer_used > before or refused(stream))  # noqa: B023
            if refused(stream):
                num_refused += 1
                with pytest.raises(Overloaded):
                    await stream.next()
            stream.close()  # the client leaves: an abort behind its request
        assert num_refused >= capacity // 2, num_refused  # the excess was refused, not queued
        waiting_aborts = runtime._scheduler_inbox.aborts.statistics().current_buffer_used  # noqa: SLF001
        assert waiting_aborts == num_admitted  # every admitted client that left has its abort queued: none lost
        assert runtime.dead_reason is None

        runner.release.set()
        tokens = [delta async for delta in keeper]
        assert sum(len(d.token_ids) for d in tokens) == 3
        keeper.close()
        await wait_idle(runtime)
        assert not runtime._scheduler_inbox.aborts.statistics().current_buffer_used  # noqa: SLF001 - all applied
        again = runtime.open(Prompt(token_ids=[9, 9]), SamplingParams(max_tokens=2, ignore_eos=True))
        assert sum([len(d.token_ids) async for d in again]) == 2
        again.close()
        runtime.stop()
