"""The Ray tier: one local Ray instance for the whole tier, and serve-ray deployments on it.

`ray.init(num_cpus=4)` once; each deployment is the real application (api/cluster/deploy.py:
Ray's HTTP proxy -> ingress -> replicas -> config actor) on the tiny model built in the test,
with fractional CPUs and one torch thread per replica. A deployment is reused by every test
that asks for the same shape, and replaced (serve.run again) when a test asks for another;
the modules run in an order (file names) that needs five deployments in all (the last,
test_unhealthy_replica.py's, carries its stuck-step fault: stuck_step.py).
Skipped as a whole when ray is not importable (it is the optional `.[ray]` extra).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="the Ray tier needs the ray extra: pip install '.[ray]'")
serve = pytest.importorskip("ray.serve")

from api.cluster.settings import ClusterSettings, ClusterSpec  # noqa: E402
from api.platform.config import PlatformConfig  # noqa: E402
from tests.cluster import stuck_step  # noqa: E402
from tests.conftest import tiny_config  # noqa: E402


@dataclass
class Cluster:
    base_url: str
    settings: ClusterSettings
    state_dir: Path

    @property
    def openai_url(self) -> str:
        return self.base_url + "/v1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Package scope: Ray's processes (controller, proxy, idle replicas polling their health)
# go away when this tier ends, instead of competing with the rest of the suite for the cores.
@pytest.fixture(scope="package")
def ray_instance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    from api.cluster.proxy_guard import PROXY_CALLBACK, PROXY_CALLBACK_ENV

    os.environ.setdefault(PROXY_CALLBACK_ENV, PROXY_CALLBACK)  # as deploy.run sets it: the proxy inherits it
    # The setup hook does nothing unless a deployment's runtime_env names a stuck-step directory
    # (tests/cluster/stuck_step.py); Ray runs a hook given by module path only from the job's runtime_env.
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False, runtime_env=stuck_step.JOB_RUNTIME_ENV)
    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    yield port
    serve.shutdown()
    ray.shutdown()


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
        replicas' processes (a test's fault hook: tests/cluster/stuck_step.py)."""
        from api.cluster.deploy import APP_NAME, build_application

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
    from api.cluster.deploy import REPLICA_DEPLOYMENT

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


@pytest.fixture(scope="package")
def deployer(ray_instance: int, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Deployer:
    return Deployer(ray_instance, tiny_model_dir, tmp_path_factory.mktemp("cluster-state"))


@pytest.fixture
def cluster(deployer: Deployer) -> Cluster:
    """Two replicas behind two ingress replicas, prefix-aware routing."""
    return deployer()
