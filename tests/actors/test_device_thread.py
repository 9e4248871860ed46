"""Every model on a device runs its torch work on that device's one thread.

A second long-lived thread running torch ops gets its own OpenMP team, and with more OpenMP
threads than CPUs libgomp makes every team sleep between parallel regions: an idle embedding
model beside the chat model made each chat decode step 1.9x slower on a 2-core machine.
"""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import trio

from tests.conftest import start_server, tiny_config


async def test_models_on_one_device_share_its_thread(tiny_model_dir: Path) -> None:
    ran_on: dict[str, set[str]] = {}
    async with trio.open_nursery() as nursery:
        srv = await start_server(nursery, tiny_config(tiny_model_dir), tiny_config(tiny_model_dir, served_name="other"))
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
