"""Per-request state lives with its one owner (runtime/request.py), wired for real on FakeRunner.

No actor holds the runtime's dict of live requests. The detokenizer's decode state is created
by the RegisterRequest on a request's first delta and destroyed at finish, or by the
scheduler's DropRequests when the client leaves mid-generation (without it, the state of every
abandoned request would stay behind).
"""

from __future__ import annotations

from pathlib import Path

import trio

from runtime.request import Prompt
from runtime.sampling import SamplingParams
from tests.support.fakes import fake_runtime
from tests.support.waiting import wait_idle


async def test_decode_state_is_made_by_the_first_delta_and_dropped_when_the_client_leaves(tiny_model_dir: Path) -> None:
    runtime = fake_runtime(tiny_model_dir, step_delay=0.005)
    async with trio.open_nursery() as nursery:
        await nursery.start(runtime.run)
        for actor in (runtime.tokenizer_actor, runtime.scheduler, runtime.detokenizer, runtime.executor):
            assert all(value is not runtime.requests for value in vars(actor).values()), type(actor).__name__
        states = runtime.detokenizer.requests

        leaving = runtime.open(Prompt(token_ids=[5, 6, 7]), SamplingParams(max_tokens=250, ignore_eos=True))
        assert not states  # nothing until the scheduler core registers it
        first = await leaving.next()
        assert first is not None and first.token_ids and list(states) == [leaving.request_id]
        assert states[leaving.request_id].start.mailbox is leaving.ctx.mailbox
        leaving.close()  # mid-generation: the core aborts it and tells the detokenizer to drop it
        await wait_idle(runtime)  # counts the detokenizer's states too
        assert runtime.scheduler.num_steps < 250

        finishing = runtime.open(Prompt(token_ids=[5, 6, 8]), SamplingParams(max_tokens=3, ignore_eos=True))
        assert sum([len(d.token_ids) async for d in finishing]) == 3
        assert not states and not runtime.requests  # the finish took both records with it
        finishing.close()
        runtime.stop()
