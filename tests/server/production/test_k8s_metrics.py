"""GET /metrics under the names Kubernetes LLM routers scrape (runtime/metrics.py):
the Gateway API Inference Extension and vLLM's production-stack router."""

from __future__ import annotations

import httpx
import trio

from tests.support.http import samples, value
from tests.support.servers import Server

ROUTER_GAUGES = (
    "vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_hit_rate",
)


async def scrape(http: httpx.AsyncClient) -> dict:
    r = await http.get("/metrics")
    assert r.status_code == 200
    return samples(r.text)


async def test_router_gauges_follow_a_running_request(server: Server) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        idle = await scrape(http)
        for name in ROUTER_GAUGES:
            assert (name, frozenset({("model_name", "tiny")})) in idle, name
        assert value(idle, "vllm:num_requests_running") == 0 and value(idle, "vllm:kv_cache_usage_perc") == 0
        info = [lbls for (n, lbls) in idle if n == "vllm:cache_config_info"]
        assert info and dict(info[0])["block_size"] == str(server.config.block_size)

        body = {"model": "tiny", "prompt": "Paged attention " * 8, "max_tokens": 400, "stream": True, "ignore_eos": True}
        async with http.stream("POST", "/v1/completions", json=body) as r:
            async for _ in r.aiter_lines():
                busy = await scrape(http)
                if value(busy, "vllm:num_requests_running") == 1:
                    break
            usage = value(busy, "vllm:kv_cache_usage_perc")
            assert 0 < usage <= 1, usage  # a fraction, not a percentage
            assert usage == value(busy, "vllm:gpu_cache_usage_perc")
            used = value(busy, "switchyard_kv_blocks_used")
            total = used + value(busy, "switchyard_kv_blocks_free")
            assert abs(usage - used / total) < 1e-9

        with trio.fail_after(5):  # the client left: its blocks go back within a step
            while value(await scrape(http), "vllm:kv_cache_usage_perc") != 0:
                await trio.sleep(0.02)
        after = await scrape(http)
        assert value(after, "vllm:gpu_prefix_cache_queries_total") == value(after, "switchyard_prefix_cache_queries_total")
