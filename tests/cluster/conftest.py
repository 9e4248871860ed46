"""The Ray tier: one local Ray instance for the whole tier, and serve-ray deployments on it.

`ray.init(num_cpus=4)` once; each deployment is the real application (api/cluster/deploy.py:
Ray's HTTP proxy -> ingress -> replicas -> config actor) on the tiny model built in the test,
with fractional CPUs and one torch thread per replica (tests/support/cluster.py's Deployer).
A deployment is reused by every test that asks for the same shape, and replaced (serve.run
again) when a test asks for another; the modules run in an order (file names) that needs six
deployments in all (the last, test_unhealthy_replica.py's, carries its stuck-step fault:
tests/support/stuck_step.py).
Skipped as a whole when ray is not importable (it is the optional `.[ray]` extra).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

ray = pytest.importorskip("ray", reason="the Ray tier needs the ray extra: pip install '.[ray]'")
serve = pytest.importorskip("ray.serve")

from tests.support import stuck_step  # noqa: E402
from tests.support.cluster import Cluster, Deployer  # noqa: E402
from tests.support.servers import free_port  # noqa: E402


# Package scope: Ray's processes (controller, proxy, idle replicas polling their health)
# go away when this tier ends, instead of competing with the rest of the suite for the cores.
@pytest.fixture(scope="package")
def ray_instance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    from api.cluster.proxy_guard import PROXY_CALLBACK, PROXY_CALLBACK_ENV

    os.environ.setdefault(PROXY_CALLBACK_ENV, PROXY_CALLBACK)  # as deploy.run sets it: the proxy inherits it
    # The setup hook does nothing unless a deployment's runtime_env names a stuck-step directory
    # (tests/support/stuck_step.py); Ray runs a hook given by module path only from the job's runtime_env.
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False, runtime_env=stuck_step.JOB_RUNTIME_ENV)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    yield port
    serve.shutdown()
    ray.shutdown()


@pytest.fixture(scope="package")
def deployer(ray_instance: int, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Deployer:
    return Deployer(ray_instance, tiny_model_dir, tmp_path_factory.mktemp("cluster-state"))


@pytest.fixture
def cluster(deployer: Deployer) -> Cluster:
    """Two replicas behind two ingress replicas, prefix-aware routing."""
    return deployer()


@pytest.fixture
def client(cluster: Cluster) -> Iterator[openai.OpenAI]:
    """The official openai client on the module's `cluster` (tests/support/openai_cases.py)."""
    with openai.OpenAI(base_url=cluster.openai_url, api_key="unused", max_retries=0, timeout=60) as c:
        yield c
