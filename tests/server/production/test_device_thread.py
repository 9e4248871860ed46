"""Every model on a device runs its torch work on that device's one thread.

A second long-lived thread running torch ops gets its own OpenMP team, and with more OpenMP
threads than CPUs libgomp makes every team sleep between parallel regions: an idle embedding
model beside the chat model made each chat decode step 1.9x slower on a 2-core machine.
"""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest
import trio

from runtime.thread_bridge import DedicatedThread, DeviceThreads
from tests.support.servers import start_server, tiny_config

pytestmark = pytest.mark.in_process  # the engine in the server's process (tests/conftest.py)


async def test_models_on_one_device_share_its_thread(tiny_model_dir: Path) -> None:
    ran_on: dict[str, set[str]] = {}
    async with trio.open_nursery() as nursery:
        # One left to "auto", one asking for "cpu" by name: the same device, so the same thread.
        srv = await start_server(nursery, tiny_config(tiny_model_dir), tiny_config(tiny_model_dir, served_name="other", device="cpu"))
        first, second = srv.runtimes  # type: ignore[misc]
        assert first.executor.thread is second.executor.thread  # type: ignore[attr-defined]
        for runtime in (first, second):
            execute = runtime.runner.execute  # type: ignore[attr-defined]

            def spy(plan, _execute=execute, _name=runtime.served_name):  # type: ignore[no-untyped-def]
                ran_on.setdefault(_name, set()).add(threading.current_thread().name)
                return _execute(plan)

            runtime.runner.execute = spy  # type: ignore[attr-defined]
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=30) as http:
            for model in ("tiny", "other"):
                resp = await http.post("/v1/completions", json={"model": model, "prompt": [5, 6, 7], "max_tokens": 3})
                assert resp.status_code == 200
        srv.stop.set()
    assert ran_on["tiny"] == ran_on["other"] and len(ran_on["tiny"]) == 1
    assert not first.executor.thread.is_alive  # type: ignore[attr-defined]  # the last user stopped it


async def test_models_sharing_a_thread_must_agree_on_num_threads() -> None:
    threads = DeviceThreads()
    first = threads.acquire("cpu", num_threads=2)
    assert threads.acquire("cpu") is first  # no opinion: takes the device's
    assert threads.acquire("cpu", num_threads=2) is first
    with pytest.raises(ValueError, match="num_threads 1 and 2"):
        threads.acquire("cpu", num_threads=1)
    for _ in range(3):
        await threads.release("cpu")
    assert threads.acquire("cpu", num_threads=1) is not first  # the last user stopped it: a fresh start
    await threads.release("cpu")


def test_a_thread_left_over_from_an_ended_trio_run_is_replaced() -> None:
    threads = DeviceThreads()
    release = threading.Event()

    async def end_with_a_job_in_flight() -> DedicatedThread:  # e.g. a test that failed mid-step
        thread = threads.acquire("cpu")
        with trio.move_on_after(0.05):
            await thread.run(release.wait, 5)
        return thread

    stale = trio.run(end_with_a_job_in_flight)
    release.set()  # the job ends after its trio run did: the thread cannot deliver, and exits
    stale._thread.join(timeout=5)
    assert stale.finished

    async def next_run() -> int:
        thread = threads.acquire("cpu")
        assert thread is not stale
        try:
            with trio.fail_after(5):
                return await thread.run(lambda: 7)
        finally:
            await threads.release("cpu")

    assert trio.run(next_run) == 7


def test_housekeeping_runs_between_jobs_on_the_thread() -> None:
    ran_on: list[str] = []
    thread = DedicatedThread("housekeeping-test", housekeeping=lambda: ran_on.append(threading.current_thread().name), every_s=0.0)

    async def jobs() -> None:
        for _ in range(3):
            await thread.run(lambda: None)
        await thread.stop()

    trio.run(jobs)
    assert ran_on and set(ran_on) == {"housekeeping-test"}
