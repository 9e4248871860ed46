"""A burst's excess is refused at the edge, before the app reads a body.

Refusals in a burst of 80 against `--max-pending 8` took p50 197 ms. The edge sheds on the
runtimes' live count, and a request counts there only once `Runtime.open` admits it, after
its body is read, decoded and validated: in a burst all 80 arrived inside that window, saw
room, and most went the whole way through the app to be refused by `Runtime.open`, each
paying a full request's work on the one event loop. The edge now counts a request it lets
through from that moment (`Admission.entering`). An edge refusal never decodes the body, so
the access metrics carry no model for it (model=""); a refusal inside the app names the
model it decoded. No timing asserted: `ops/overload.py` measures latency (README).
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import httpx
import trio

from ops.load.overload import burst
from runtime.config import RuntimeConfig
from tests.support.fakes import fake_runtime
from tests.support.http import serves_normally
from tests.support.servers import start_runtime_server
from tests.support.waiting import wait_idle


def refusals_by_model(metrics: str) -> dict[str, int]:
    pattern = r'switchyard_http_requests_total\{model="([^"]*)",route="/v1/completions",status="429"\} (\S+)'
    return {model: int(float(value)) for model, value in re.findall(pattern, metrics)}


async def test_a_bursts_excess_is_shed_at_the_edge(tiny_model_dir) -> None:  # type: ignore[no-untyped-def]
    config = RuntimeConfig(served_name="fake", port=0, max_pending=8, drain_timeout=2.0)
    runtime = fake_runtime(tiny_model_dir, config, step_delay=0.01)
    async with trio.open_nursery() as nursery:
        srv = await start_runtime_server(nursery, runtime)
        await serves_normally(srv.base_url)
        url = urlsplit(srv.base_url)
        body = {"prompt": "The quick brown fox", "max_tokens": 16, "ignore_eos": True}
        results = []
        with trio.fail_after(120):
            for _ in range(3):
                results += await burst(url.hostname or "127.0.0.1", url.port or 80, 80, body, timeout=30)
                await wait_idle(runtime)
        statuses = [r["status"] for r in results]
        assert statuses.count(200) >= 24 and statuses.count(200) + statuses.count(429) == 240, sorted(set(statuses))
        assert all(r["complete"] for r in results if r["status"] == 200)
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=30) as http:
            refused = refusals_by_model((await http.get("/metrics")).text)
        assert refused.get("", 0) == statuses.count(429) and refused.get("fake", 0) == 0, refused
        await serves_normally(srv.base_url)
        srv.stop.set()
