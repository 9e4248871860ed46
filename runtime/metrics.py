"""Prometheus metrics for one server: what `GET /metrics` exposes.

Owns: `ServerMetrics`, with its own `CollectorRegistry` (one per app, so several servers in
one test process never collide), and every metric's name and buckets:

- fed by the API edge: requests by route / model / status, HTTP duration;
- fed by each runtime's finish hook (the detokenizer calls it once per finished request):
  time to first token, inter-token latency, end-to-end latency, queue time, token counts;
- fed by each runtime's step hook (the executor calls it once per step): tokens per step,
  step time, failed steps;
- read at scrape time from `Runtime.statistics()`: running / waiting / live requests,
  pending admission tokens, KV blocks used and free, prefix-cache queries, hits and hit rate;
- the same figures under the vLLM names Kubernetes LLM routers scrape (`_vllm_families`;
  docs/scaling-out.md, "Kubernetes routers, one node per pod");
- the event-loop lag watchdog (expected vs actual wake-up of a periodic sleep).

Hooks are synchronous and O(1) per call (O(tokens) once per request for inter-token
latency); nothing here awaits on the hot path. Imports prometheus_client, trio and runtime.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

import trio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from runtime.messages import FinishReason, StepPlan
    from runtime.protocol import Runtime
    from runtime.request import DecodeState

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
_TOKEN_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
_STEP_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
_LOOP_LAG = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class ServerMetrics:
    """Every metric of one server. `attach(runtime)` before the runtime runs."""

    def __init__(self, runtimes: Iterable[Runtime] = ()) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.http_requests = Counter(
            "switchyard_http_requests", "HTTP requests by route template, model and status (499: client left mid-response).",
            ["route", "model", "status"], registry=r,
        )
        self.http_duration = Histogram(
            "switchyard_http_request_duration_seconds", "Time from request start to last byte sent (or client gone).",
            ["route"], buckets=_LATENCY, registry=r,
        )
        self.ttft = Histogram("switchyard_time_to_first_token_seconds", "Arrival to first generated token.", ["model"], buckets=_LATENCY, registry=r)
        self.itl = Histogram("switchyard_inter_token_latency_seconds", "Time between consecutive tokens of one request.", ["model"], buckets=_TOKEN_LATENCY, registry=r)
        self.e2e = Histogram("switchyard_e2e_request_latency_seconds", "Arrival to finish of a completed request.", ["model"], buckets=_LATENCY, registry=r)
        self.queue_time = Histogram("switchyard_request_queue_time_seconds", "Arrival to first scheduled step.", ["model"], buckets=_LATENCY, registry=r)
        self.finished = Counter("switchyard_requests_finished", "Requests that finished, by finish reason.", ["model", "finish_reason"], registry=r)
        self.prompt_tokens = Counter("switchyard_prompt_tokens", "Prompt tokens of finished requests.", ["model"], registry=r)
        self.generation_tokens = Counter("switchyard_generation_tokens", "Generated tokens of finished requests.", ["model"], registry=r)
        self.step_tokens = Histogram("switchyard_step_tokens", "Tokens fed to the model per step (prefill chunks + decodes).", ["model"], buckets=_STEP_TOKENS, registry=r)
        self.step_time = Histogram("switchyard_step_duration_seconds", "Wall time of one device step.", ["model"], buckets=_TOKEN_LATENCY, registry=r)
        self.step_failures = Counter("switchyard_step_failures", "Device steps that raised (their requests failed).", ["model"], registry=r)
        self.loop_lag = Histogram("switchyard_event_loop_lag_seconds", "How late the event loop woke a periodic sleep.", buckets=_LOOP_LAG, registry=r)
        self.loop_lag_last = Gauge("switchyard_event_loop_lag_last_seconds", "The latest event-loop lag sample.", registry=r)
        self._runtimes: list[Runtime] = []
        self._lag_scope: trio.CancelScope | None = None
        r.register(_RuntimeCollector(self._runtimes))
        for runtime in runtimes:
            self.attach(runtime)

    def attach(self, runtime: Runtime) -> None:
        name = runtime.served_name
        self._runtimes.append(runtime)
        runtime.on_finish.append(partial(self._on_finish, name))
        runtime.on_step.append(partial(self._on_step, name))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    # -- hooks --------------------------------------------------------------------------------

    def observe_http(self, route: str, model: str, status: int, seconds: float) -> None:
        self.http_requests.labels(route, model, str(status)).inc()
        self.http_duration.labels(route).observe(seconds)

    def _on_finish(self, model: str, state: DecodeState, finish: FinishReason, now: float) -> None:
        model = state.start.sampling.adapter or model  # a LoRA adapter's requests and tokens under its own name
        arrival = state.start.arrival_time
        if state.first_token_time is not None:
            self.ttft.labels(model).observe(state.first_token_time - arrival)
        self.queue_time.labels(model).observe(state.start.scheduled_time - arrival)
        self.e2e.labels(model).observe(now - arrival)
        itl = self.itl.labels(model)
        for wait_us in state.token_wait_us[1:]:  # [0] is the wait for the first token (TTFT)
            itl.observe(wait_us / 1e6)
        self.finished.labels(model, finish.value).inc()
        self.prompt_tokens.labels(model).inc(state.start.num_prompt_tokens)
        self.generation_tokens.labels(model).inc(state.num_output_tokens)

    def _on_step(self, model: str, plan: StepPlan, elapsed: float, failed: bool) -> None:
        self.step_tokens.labels(model).observe(plan.num_tokens)
        self.step_time.labels(model).observe(elapsed)
        if failed:
            self.step_failures.labels(model).inc()

    # -- event-loop lag -----------------------------------------------------------------------

    async def watch_event_loop(self, interval: float = 0.1) -> None:
        """Sample event-loop lag until `stop_watching()`: a late wake-up means something blocked."""
        with trio.CancelScope() as self._lag_scope:
            while True:
                start = trio.current_time()
                await trio.sleep(interval)
                lag = max(0.0, trio.current_time() - start - interval)
                self.loop_lag.observe(lag)
                self.loop_lag_last.set(lag)

    def stop_watching(self) -> None:
        if self._lag_scope is not None:
            self._lag_scope.cancel()


class _RuntimeCollector(Collector):
    """Gauges read from each runtime's `statistics()` at scrape time (never stale, no hooks)."""

    def __init__(self, runtimes: list[Runtime]) -> None:
        self._runtimes = runtimes

    def collect(self) -> Iterator[Metric]:
        gauges = {
            "running": GaugeMetricFamily("switchyard_requests_running", "Requests in the running batch.", labels=["model"]),
            "waiting": GaugeMetricFamily("switchyard_requests_waiting", "Requests waiting in the scheduler.", labels=["model"]),
            "live_requests": GaugeMetricFamily("switchyard_requests_live", "Admitted, unfinished requests (tokenizing, waiting, running).", labels=["model"]),
            "pending_tokens": GaugeMetricFamily("switchyard_pending_tokens", "Estimated tokens (prompt + max_tokens) of admitted, unfinished requests.", labels=["model"]),
            "kv_blocks_used": GaugeMetricFamily("switchyard_kv_blocks_used", "KV-cache blocks in use.", labels=["model"]),
            "kv_blocks_free": GaugeMetricFamily("switchyard_kv_blocks_free", "KV-cache blocks free (including cached, evictable ones).", labels=["model"]),
            "prefix_hit_rate": GaugeMetricFamily("switchyard_prefix_cache_hit_rate", "Prefix-cache hits / queries (full blocks) since start.", labels=["model"]),
            "healthy": GaugeMetricFamily("switchyard_engine_healthy", "1 while /health would answer 200.", labels=["model"]),
        }
        counters = {
            "prefix_queries": CounterMetricFamily("switchyard_prefix_cache_queries", "Full prompt blocks looked up in the prefix cache.", labels=["model"]),
            "prefix_hits": CounterMetricFamily("switchyard_prefix_cache_hits", "Full prompt blocks found in the prefix cache.", labels=["model"]),
            "preemptions": CounterMetricFamily("switchyard_preemptions", "Requests preempted (blocks freed, recomputed later).", labels=["model"]),
            "spec_draft_tokens": CounterMetricFamily("switchyard_spec_draft_tokens", "Speculative decoding: draft tokens verified.", labels=["model"]),
            "spec_accepted_tokens": CounterMetricFamily("switchyard_spec_accepted_tokens", "Speculative decoding: draft tokens kept.", labels=["model"]),
            "steps": CounterMetricFamily("switchyard_steps", "Device steps run.", labels=["model"]),
        }
        vllm = _vllm_families()
        for runtime in self._runtimes:
            stats = _statistics(runtime)
            if stats is None:
                continue
            labels = [runtime.served_name]
            queries = stats.get("prefix_queries", 0)
            stats["prefix_hit_rate"] = stats.get("prefix_hits", 0) / queries if queries else 0.0
            stats["healthy"] = 1.0 if runtime.health()[0] else 0.0
            blocks = stats.get("kv_blocks_used", 0) + stats.get("kv_blocks_free", 0)
            stats["kv_usage"] = stats.get("kv_blocks_used", 0) / blocks if blocks else 0.0
            for families in (gauges, counters):
                for key, family in families.items():
                    if key in stats:
                        family.add_metric(labels, float(stats[key]))
            for key, vllm_family in vllm:
                if key in stats:
                    vllm_family.add_metric(labels, float(stats[key]))
            if blocks and runtime.info is not None:
                info = GaugeMetricFamily("vllm:cache_config_info", "KV cache configuration (the value is 1).", labels=["model_name", "block_size", "num_gpu_blocks"])
                info.add_metric([runtime.served_name, str(runtime.info.block_size), str(blocks)], 1.0)
                yield info
        yield from gauges.values()
        yield from counters.values()
        yield from (family for _, family in vllm)


# The Gateway API Inference Extension's endpoint picker reads `vllm:num_requests_waiting`,
# `vllm:num_requests_running`, `vllm:kv_cache_usage_perc` (a 0-1 fraction despite the name) and,
# for prefix-aware scoring, `vllm:cache_config_info{block_size}`; vLLM's production-stack router
# reads the two request gauges, `vllm:gpu_cache_usage_perc` and
# `vllm:gpu_prefix_cache_{hits,queries}_total` / `vllm:gpu_prefix_cache_hit_rate`. All carry a
# `model_name` label, as vLLM's do.
def _vllm_families() -> list[tuple[str, GaugeMetricFamily | CounterMetricFamily]]:
    """(statistics key, family) under vLLM's names, for Kubernetes routers."""
    labels = ["model_name"]
    return [
        ("waiting", GaugeMetricFamily("vllm:num_requests_waiting", "Requests waiting to be scheduled.", labels=labels)),
        ("running", GaugeMetricFamily("vllm:num_requests_running", "Requests in the running batch.", labels=labels)),
        ("kv_usage", GaugeMetricFamily("vllm:kv_cache_usage_perc", "KV-cache usage as a 0-1 fraction of blocks in use.", labels=labels)),
        ("kv_usage", GaugeMetricFamily("vllm:gpu_cache_usage_perc", "KV-cache usage as a 0-1 fraction (vLLM's older name).", labels=labels)),
        ("prefix_hit_rate", GaugeMetricFamily("vllm:gpu_prefix_cache_hit_rate", "Prefix-cache block hit rate since start.", labels=labels)),
        ("prefix_queries", CounterMetricFamily("vllm:gpu_prefix_cache_queries", "Full prompt blocks looked up in the prefix cache.", labels=labels)),
        ("prefix_hits", CounterMetricFamily("vllm:gpu_prefix_cache_hits", "Full prompt blocks found in the prefix cache.", labels=labels)),
    ]


def _statistics(runtime: Runtime) -> dict[str, Any] | None:
    if getattr(runtime, "scheduler", None) is None:  # not started yet
        return None
    stats = dict(runtime.statistics())
    stats["pending_tokens"] = runtime.pending_tokens()
    return stats
