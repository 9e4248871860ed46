"""The Ray tier's deployments and failure helpers (imports ray: only tests/cluster uses it).

`Deployer` deploys the real application (api/cluster/deploy.py: Ray's HTTP proxy -> ingress
-> replicas -> config actor) on the tiny model, with fractional CPUs and one torch thread per
replica, and keeps it while tests ask for the same shape. `fail_mid_stream`,
`kill_mid_stream_and_recover` and `whole_again` are a replica failing under a client's
stream and the deployment whole again afterwards, on either topology.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import ray
import trio
from ray import serve
from ray.util import list_named_actors

from api.cluster.deploy import APP_NAME, REPLICA_DEPLOYMENT
from api.cluster.settings import ClusterSettings, ClusterSpec
from api.http.platform.config import PlatformConfig
from tests.support.servers import tiny_config

REPLICA = "x-switchyard-replica"  # the response header naming the replica that served it
LONG = {"model": "tiny", "prompt": "Paged attention keeps keys", "max_tokens": 450, "stream": True, "ignore_eos": True}


@dataclass
class Cluster:
    base_url: str
    settings: ClusterSettings
    state_dir: Path

    @property
    def openai_url(self) -> str:
        return self.base_url + "/v1"


# Two replicas behind two ingress replicas: 1.5 of the instance's 4 CPUs.
DEFAULT_SHAPE: dict[str, Any] = dict(
    replicas=2, ingress_replicas=2, replica_cpus=0.5, ingress_cpus=0.25,
    routing_stats_period_s=0.5, health_check_period_s=1.0, health_check_timeout_s=10.0,
    graceful_shutdown_timeout_s=5.0,
)


class Deployer:
    """Deploys the application for a given shape, keeping it while tests ask for the same one."""

    def __init__(self, port: int, model_dir: Path, state_dir: Path) -> None:
        self.port, self.model_dir, self.state_dir = port, model_dir, state_dir
        self.current: tuple[Any, ...] | None = None

    def __call__(
        self,
        fresh: bool = False,
        platform: dict[str, Any] | None = None,
        model: dict[str, Any] | None = None,
        runtime_env: dict[str, Any] | None = None,
        **shape: Any,
    ) -> Cluster:
        """`shape`: ClusterSettings over DEFAULT_SHAPE; `platform`: PlatformConfig settings;
        `model`: the tiny model's RuntimeConfig settings; `runtime_env`: Ray's, for the model
        replicas' processes (a test's fault hook: tests/support/stuck_step.py)."""
        from api.cluster.deploy import build_application

        settings = ClusterSettings(**{**DEFAULT_SHAPE, **shape})
        key = tuple(repr(sorted((part or {}).items())) for part in (shape, platform, model, runtime_env))
        if fresh or key != self.current:
            serve.delete(APP_NAME)
            spec = ClusterSpec(
                models=[tiny_config(self.model_dir, num_threads=1, **(model or {}))],
                platform=PlatformConfig(state_dir=str(self.state_dir), **(platform or {})),
                settings=settings,
            )
            with replica_runtime_env(runtime_env):
                application = build_application(spec)
            serve.run(application, name=APP_NAME, route_prefix="/")
            self.current = key
        return Cluster(f"http://127.0.0.1:{self.port}", settings, self.state_dir)


@contextmanager
def replica_runtime_env(runtime_env: dict[str, Any] | None) -> Iterator[None]:
    """While building the application, the model replicas' deployment gets `runtime_env` in
    its ray_actor_options: through Ray's own `serve.deployment` options, which build_application
    reads from `ray.serve` when it runs, so the product needs no hook of its own."""
    if not runtime_env:
        yield
        return
    original = serve.deployment

    def deployment(*args: Any, **options: Any) -> Any:
        if options.get("name") == REPLICA_DEPLOYMENT:
            options["ray_actor_options"] = {**options.get("ray_actor_options", {}), "runtime_env": runtime_env}
        return original(*args, **options)

    serve.deployment = deployment
    try:
        yield
    finally:
        serve.deployment = original


def replica_actor(unique_id: str):  # type: ignore[no-untyped-def]
    for entry in list_named_actors(all_namespaces=True):
        if entry["name"].startswith("SERVE_REPLICA::") and entry["name"].endswith(f"#{unique_id}"):
            return ray.get_actor(entry["name"], namespace=entry["namespace"])
    raise AssertionError(f"no actor for replica {unique_id}")


def running_replicas() -> int:
    status = serve.status().applications[APP_NAME].deployments[REPLICA_DEPLOYMENT]
    return status.replica_states.get("RUNNING", 0)


async def kill_mid_stream_and_recover(cluster: Cluster) -> None:
    async with httpx.AsyncClient(base_url=cluster.base_url, timeout=60) as http:
        victim = await fail_mid_stream(http, "doomed", lambda victim: ray.kill(replica_actor(victim), no_restart=True), within=30)

        # Others are served meanwhile; each request is answered (a 503 at worst while the
        # routers learn the replica is gone), none hangs.
        statuses = []
        with trio.fail_after(60):
            for i in range(10):
                r = await http.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2}, headers={"x-session-id": f"s-{i}"})
                statuses.append(r.status_code)
                assert r.status_code in (200, 503), r.text
        assert statuses.count(200) >= 5, statuses

        seen = await whole_again(http, victim)
        print(f"\nkilled replica {victim} mid-stream; next 10 requests {statuses}; replaced, now serving from {sorted(seen)}")


async def whole_again(http: httpx.AsyncClient, victim: str) -> set[str]:
    """Once the controller has replaced `victim`, two replicas serve again, neither of them it."""
    with trio.fail_after(90):
        while running_replicas() < 2:
            await trio.sleep(0.5)
        seen: set[str] = set()
        i = 0
        while len(seen) < 2:
            r = await http.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2}, headers={"x-session-id": f"after-{i}"})
            i += 1
            if r.status_code == 200:
                seen.add(r.headers[REPLICA])
    assert victim not in seen
    return seen


async def fail_mid_stream(http: httpx.AsyncClient, session: str, fault: Callable[[str], object], within: float) -> str:
    """Stream a long completion and, after its third event, `fault(replica id)`: the stream
    must end within `within` s (never a hang) with an error event and [DONE]. The victim."""
    events: list[str] = []
    with trio.fail_after(within):
        async with http.stream("POST", "/v1/completions", json=LONG, headers={"x-session-id": session}) as r:
            assert r.status_code == 200
            victim = r.headers[REPLICA]
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(line)
                if len(events) == 3:
                    fault(victim)
    assert events[-1] == "data: [DONE]"
    assert '"code":"replica_failed"' in events[-2], events[-2]
    assert len(events) < 100, "the stream ran to its end: the fault did not land mid-stream"
    return victim


# serve-ray as a command (its own process): ready once its log says so.
READY_TIMEOUT_S = 180.0  # Ray's start, Serve's, a replica importing torch: ~20 s alone here


def wait_ready(proc: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while b"serve_ray_ready" not in log_path.read_bytes():
        assert proc.poll() is None, f"serve-ray exited {proc.returncode} before it was ready:\n{log_tail(log_path)}"
        assert time.monotonic() < deadline, f"serve-ray not ready after {READY_TIMEOUT_S:.0f}s:\n{log_tail(log_path)}"
        time.sleep(0.5)


def log_tail(path: Path) -> str:
    return path.read_bytes()[-4000:].decode("utf-8", "replace")
