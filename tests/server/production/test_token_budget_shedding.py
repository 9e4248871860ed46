"""Token-budget admission before the body: once the admitted
requests' estimates fill `max_pending_tokens`, every new generation request is refused by the
edge's load shedding with a fast 429, before its body is read: a body that is not even JSON
gets the 429 (the app would have said 400). While the budget still has room, whether a request
fits depends on its own estimate, which needs its body: `Runtime.open` decides that."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import httpx
import trio

from runtime.config import RuntimeConfig
from tests.support.fakes import fake_runtime
from tests.support.http import serves_normally
from tests.support.servers import start_runtime_server
from tests.support.waiting import wait_idle

# "Hello there!" is 12 bytes: 12 / 4 + 1 = 4 prompt tokens, + max_tokens 36 = 40, the whole budget.
BUDGET = 40
HOLD = {"prompt": "Hello there!", "max_tokens": 36, "ignore_eos": True}


async def test_spent_token_budget_sheds_before_the_body(tiny_model_dir: Path) -> None:
    config = RuntimeConfig(served_name="fake", port=0, max_pending_tokens=BUDGET, drain_timeout=2.0)
    runtime = fake_runtime(tiny_model_dir, config)
    async with trio.open_nursery() as nursery:
        srv = await start_runtime_server(nursery, runtime)
        await serves_normally(srv.base_url)
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=30) as http:
            r = await http.post("/v1/completions", content=b"{not json")  # room in the budget: the app reads it
            assert r.status_code == 400, r.text
            runtime.runner.release.clear()  # hold the device: the admitted request keeps its tokens
            async with trio.open_nursery() as held:
                held.start_soon(partial(http.post, "/v1/completions", json=HOLD))
                with trio.fail_after(10):
                    while runtime.pending_tokens() < BUDGET:
                        await trio.sleep(0.01)
                assert len(runtime.requests) == 1 < config.max_pending  # not full by count
                for path in ("/v1/completions", "/v1/chat/completions", "/v1/responses"):
                    r = await http.post(path, content=b"{not json")
                    assert r.status_code == 429 and r.headers["retry-after"] == "1", (path, r.status_code, r.text)
                    assert r.json()["error"]["code"] == "overloaded"
                assert (await http.get("/v1/models")).status_code == 200
                runtime.runner.release.set()
        await wait_idle(runtime)
        await serves_normally(srv.base_url)
        srv.stop.set()
