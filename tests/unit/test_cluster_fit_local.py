"""serve-ray on a local Ray instance fits the machine, or says why it cannot.

`switchyard serve-ray --replicas 2`, the README's example for a local instance, asked for two
replicas at 1 CPU and an ingress at 0.5 on a 2-core machine: Ray never scheduled the ingress
and the command waited forever, logging every 30 s. What the user left to its default is now
lowered to fit (the ready line says so); what the user asked for that can never fit fails at
once, before Ray starts, with one line naming the flags and the numbers, exit status 2.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from api.cluster.settings import ClusterConfigError, ClusterSettings, fit_local
from tests.support.cli import assert_one_line_usage_error, run_cli


def test_the_readmes_example_is_lowered_to_fit_two_cpus() -> None:
    settings = ClusterSettings(replicas=2)  # relay: prefix routing over two replicas, one ingress
    report = fit_local(settings, 2, given={"replicas"})
    assert report == {"cpus": 2, "lowered_to_fit": {"replica_cpus": 0.8, "ingress_cpus": 0.4}}
    assert 2 * settings.replica_cpus + settings.ingress_cpus <= 2


def test_what_fits_is_left_alone() -> None:
    settings = ClusterSettings(replicas=2)
    assert fit_local(settings, 4, given=set()) == {"cpus": 4}
    assert (settings.replica_cpus, settings.ingress_cpus) == (1.0, 0.5)
    direct = ClusterSettings(replicas=2, router="pow2")  # no ingress on the direct topology
    assert fit_local(direct, 2, given=set()) == {"cpus": 2}


def test_an_explicit_choice_is_kept_and_the_rest_fits_around_it() -> None:
    settings = ClusterSettings(replicas=2, replica_cpus=0.5)
    assert fit_local(settings, 2, given={"replica_cpus"}) == {"cpus": 2}  # 1.5 fits
    settings = ClusterSettings(replicas=3, replica_cpus=0.6)
    assert fit_local(settings, 2, given={"replica_cpus"})["lowered_to_fit"] == {"ingress_cpus": 0.2}


@pytest.mark.parametrize(
    ("settings", "given", "words"),
    [
        (ClusterSettings(replicas=2, replica_cpus=1.5), {"replica_cpus"}, ["--replicas 2", "--replica-cpus 1.5", "3.5", "has 2", "lower --replica-cpus"]),
        (ClusterSettings(replicas=2, replica_cpus=1.0, ingress_cpus=0.5), {"replica_cpus", "ingress_cpus"}, ["2.5", "has 2", "ingress_cpus"]),
        (ClusterSettings(replicas=500), set(), ["--replicas 500", "lower --replicas"]),
        (ClusterSettings(autoscaling={"min_replicas": 1, "max_replicas": 4}, replica_cpus=1.0), {"replica_cpus"}, ["max_replicas 4", "has 2"]),
    ],
)
def test_what_can_never_fit_is_refused_naming_the_flags(settings: ClusterSettings, given: set[str], words: list[str]) -> None:
    with pytest.raises(ClusterConfigError) as info:
        fit_local(settings, 2, given)
    assert all(word in str(info.value) for word in words), str(info.value)


def test_the_command_refuses_at_once_without_starting_ray(tmp_path: Path) -> None:
    """On 91a45ee this command started Ray and waited for a replica that never fit, forever."""
    try:
        proc = run_cli("serve-ray", "--replicas", "2", "--replica-cpus", "4096", "--no-embeddings", tmp_path=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail("serve-ray did not refuse within 120 s")
    assert_one_line_usage_error(proc, "--replica-cpus 4096", "--replicas 2", "local Ray instance has")
