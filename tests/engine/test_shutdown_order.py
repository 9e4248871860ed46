"""stop() closes the actors in pipeline order instead of cancelling them: the step in flight
completes, the runner is closed on its own thread, the device thread is joined, and a request
still live gets a clean shutdown error."""

from __future__ import annotations

from pathlib import Path

import trio

from actors.build import build_engine
from runtime.config import RuntimeConfig
from runtime.request import Prompt
from runtime.sampling import SamplingParams
from tests.support.servers import tiny_config


async def test_stop_closes_the_pipeline_in_order(tiny_model_dir: Path) -> None:
    config: RuntimeConfig = tiny_config(tiny_model_dir)
    runtime = build_engine(config)
    steps_done: list[int] = []
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(runtime.run)
            runtime.on_step.append(lambda plan, elapsed, failed: steps_done.append(plan.step_id))
            stream = runtime.open(Prompt(token_ids=[5, 6, 7]), SamplingParams(max_tokens=300, ignore_eos=True))
            while len(steps_done) < 3:  # decoding: a step is in flight most of the time
                await trio.sleep(0.001)
            runtime.stop()
            texts = []
            try:
                while (delta := await stream.next()) is not None:
                    texts.append(delta.text)
            except Exception as exc:  # the shutdown error
                error = exc
            else:
                raise AssertionError("a request live at stop() must end with an error")
            assert "shutting down" in str(error)
    assert not runtime._nursery.cancel_scope.cancel_called  # ended in order, not cancelled
    assert not runtime.executor.thread.is_alive
    assert runtime.runner.model is None  # closed on its thread
    assert not runtime.requests
