"""serve-ray's settings (api/cluster/settings.py, api/cluster/cli.py): the [cluster] table,
the command line over it, and what each replica is built from. No Ray needed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from api.cluster.cli import cluster_settings, cluster_spec
from api.cluster.settings import ACTORS_STOP_S, ClusterConfigError, ClusterSettings
from api.process.config_file import model_configs, read_config_file
from api.process.flags import parse_args
from runtime.config import RuntimeConfig


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "models.toml"
    path.write_text(text)
    return str(path)


def test_cluster_table_then_flags(tmp_path: Path) -> None:
    config = write(tmp_path, """
[cluster]
replicas = 3
router = "pow2"
replica_cpus = 2
[cluster.autoscaling]
min_replicas = 1
max_replicas = 8
target_ongoing_requests = 16
[cluster.router_kwargs]
epsilon = 0.5
""")
    command = parse_args(["serve-ray", "--config", config, "--replicas", "5"])

    settings = cluster_settings(command.args, read_config_file(config).cluster)
    assert settings.replicas == 5 and settings.router == "pow2" and settings.replica_cpus == 2
    assert settings.autoscaling == {"min_replicas": 1, "max_replicas": 8, "target_ongoing_requests": 16}
    assert settings.router_kwargs == {"epsilon": 0.5}
    assert read_config_file(config).cluster["replicas"] == 3  # `switchyard serve` accepts the table too


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"replicaz": 2}, "unknown keys ['replicaz']"),
        ({"router": "random"}, "router must be one of"),
        ({"replicas": 0}, "replicas must be a whole number"),
        ({"autoscaling": 3}, "[cluster.autoscaling] must be a table"),
    ],
)
def test_bad_cluster_tables_name_the_key(table: dict, message: str) -> None:
    with pytest.raises(ClusterConfigError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        ClusterSettings.from_table(table, "f.toml")


def test_replica_threads_follow_reserved_cpus_unless_set() -> None:
    settings = ClusterSettings(replica_cpus=3)
    spec = cluster_spec([RuntimeConfig(), RuntimeConfig(num_threads=1)], None, settings)
    assert [c.num_threads for c in spec.models] == [3, 1]


def test_replica_stop_bound_follows_the_drain_timeout_unless_set() -> None:
    models = [RuntimeConfig(drain_timeout=4.0), RuntimeConfig(drain_timeout=7.0)]
    spec = cluster_spec(models, None, ClusterSettings())
    assert spec.drain_timeout == 7.0 and spec.stop_timeout_s == 7.0 + ACTORS_STOP_S
    assert cluster_spec(models, None, ClusterSettings(graceful_shutdown_timeout_s=3)).stop_timeout_s == 3.0
    with pytest.raises(ClusterConfigError, match="graceful_shutdown_timeout_s must be a number"):
        ClusterSettings.from_table({"graceful_shutdown_timeout_s": "long"})


@pytest.mark.parametrize(
    ("table", "direct"),
    [
        ({}, True),  # one replica: nothing to route, so nothing needs the prompt
        ({"replicas": 2}, False),  # prefix routing reads the prompt: through the ingress
        ({"replicas": 2, "router": "pow2"}, True),
        ({"autoscaling": {"min_replicas": 1, "max_replicas": 4}}, False),
        ({"autoscaling": {"max_replicas": 4}, "router": "pow2"}, True),
        ({"topology": "relay"}, False),
        ({"topology": "relay", "router": "pow2", "replicas": 2}, False),
        ({"topology": "direct", "replicas": 2, "router": "pow2"}, True),
    ],
)
def test_topology_is_direct_wherever_routing_does_not_need_the_prompt(table: dict, direct: bool) -> None:
    assert ClusterSettings.from_table(table).direct is direct


def test_direct_topology_refuses_prefix_routing_over_several_replicas(tmp_path: Path) -> None:
    with pytest.raises(ClusterConfigError, match="topology 'direct' cannot route by prefix"):
        ClusterSettings.from_table({"topology": "direct", "replicas": 2})
    command = parse_args(["serve-ray", "--topology", "direct", "--replicas", "2"])

    with pytest.raises(SystemExit, match="cannot route by prefix"):
        cluster_settings(command.args, {})
    with pytest.raises(ClusterConfigError, match="topology must be one of"):
        ClusterSettings.from_table({"topology": "hops"})


@pytest.mark.parametrize(
    ("autoscaling", "message"),
    [
        ({"min_replica": 1, "max_replicas": 4}, "[cluster.autoscaling] has unknown keys ['min_replica']"),
        ({"min_replicas": 3, "max_replicas": 1}, "max_replicas (1) must be greater than or equal to min_replicas (3)"),
        ({"max_replicas": 4, "target_ongoing_requests": "many"}, "[cluster.autoscaling] target_ongoing_requests:"),
    ],
)
def test_a_bad_autoscaling_table_is_a_config_error_naming_the_key(tmp_path: Path, autoscaling: dict, message: str) -> None:
    pytest.importorskip("ray.serve.config", reason="checked against Ray's own AutoscalingConfig")
    with pytest.raises(ClusterConfigError, match=re.escape(message)):
        ClusterSettings.from_table({"autoscaling": autoscaling}, "f.toml")
    table = "\n".join(f"{key} = {value!r}".replace("'", '"') for key, value in autoscaling.items())
    config = write(tmp_path, f"[cluster.autoscaling]\n{table}\n")
    command = parse_args(["serve-ray", "--config", config])

    with pytest.raises(SystemExit, match=re.escape(message)):  # the command's own message, before Ray starts
        cluster_settings(command.args, read_config_file(config).cluster)


def test_health_settings_come_from_the_config_file(tmp_path: Path) -> None:
    """How soon a stuck replica is caught: the model's step_deadline, Ray's check period."""
    config = write(tmp_path, """
[[models]]
name = "tiny"
step_deadline = 2.5
[cluster]
health_check_period_s = 0.5
""")
    command = parse_args(["serve-ray", "--config", config])

    assert cluster_settings(command.args, read_config_file(config).cluster).health_check_period_s == 0.5
    assert [c.step_deadline for c in model_configs(RuntimeConfig(), config, False)] == [2.5]
    with pytest.raises(ClusterConfigError, match=re.escape("[cluster].health_check_period_s must be a number > 0")):
        ClusterSettings.from_table({"health_check_period_s": 0})
