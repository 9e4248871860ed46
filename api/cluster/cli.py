"""`switchyard serve-ray`'s glue: the parsed command line and config file -> a ClusterSpec ->
api/cluster/deploy.py. Kept apart from deploy.py so a missing `ray` gives one clear message."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import msgspec

from api.cluster.settings import ClusterConfigError, ClusterSettings, ClusterSpec, fit_local
from api.cluster.supervisor import is_driver, supervise

_FLAGS = {"replicas": "replicas", "ingress_replicas": "ingress_replicas", "replica_cpus": "replica_cpus", "router": "router", "topology": "topology"}


def cluster_settings(args: argparse.Namespace, table: dict[str, Any]) -> ClusterSettings:
    """The config file's [cluster] table, then the command line's flags over it."""
    try:
        settings = ClusterSettings.from_table(dict(table), args.config or "config")
        for flag, name in _FLAGS.items():
            if getattr(args, flag, None) is not None:
                setattr(settings, name, getattr(args, flag))
        settings.check("command line")
    except (ClusterConfigError, TypeError) as exc:
        raise SystemExit(f"switchyard serve-ray: {exc}") from None
    return settings


def fit_to_machine(settings: ClusterSettings, args: argparse.Namespace, table: dict[str, Any], cpus: int) -> dict[str, Any]:
    """`fit_local` for a local Ray instance of `cpus`, the user's own choices (the [cluster]
    keys and the flags given) kept; what the ready line reports."""
    given = set(table) | {name for flag, name in _FLAGS.items() if getattr(args, flag, None) is not None}
    try:
        return fit_local(settings, cpus, given)
    except ClusterConfigError as exc:
        raise SystemExit(f"switchyard serve-ray: {exc}") from None


def local_cpus() -> int:
    """The CPUs a local Ray instance is started with: those this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def cluster_spec(configs: list[Any], platform: Any, settings: ClusterSettings, local: dict[str, Any] | None = None) -> ClusterSpec:
    """Each replica gets its reserved CPUs as torch threads unless the models say otherwise, and,
    on CPUs, the share of the host's memory its CPUs are of the host's (its caches sized from it)."""
    threads = max(1, int(settings.replica_cpus))
    models = [c if c.num_threads is not None else msgspec.structs.replace(c, num_threads=threads) for c in configs]
    if not settings.replica_gpus:
        per_host = max(1, round(local_cpus() / settings.replica_cpus))
        models = [msgspec.structs.replace(c, memory_parts=c.memory_parts * per_host) for c in models]
    return ClusterSpec(models=models, platform=platform, settings=settings, local=local)


def serve_ray(configs: list[Any], platform: Any, args: argparse.Namespace, table: dict[str, Any]) -> None:
    """`table`: the config file's [cluster] table (api/process/config_file.py read it). With a local
    Ray instance, this process supervises the driver (api/cluster/supervisor.py) and exits with
    its status; the driver (or the only process, when joining a cluster) runs deploy.run.
    Settings that cannot work fail here, in the supervisor, before Ray is even imported."""
    address = args.address or os.environ.get("RAY_ADDRESS")  # ray.init joins RAY_ADDRESS too
    settings = cluster_settings(args, table)
    local = fit_to_machine(settings, args, table, local_cpus()) if address is None else None
    spec = cluster_spec(configs, platform, settings, local)  # bad settings fail here, once
    try:
        import ray  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError:
        raise SystemExit("switchyard serve-ray needs Ray Serve: pip install 'switchyard[ray]'") from None
    if address is None and not is_driver():
        raise SystemExit(supervise(sys.argv[1:]))
    from api.cluster.deploy import run

    run(spec, args.host, args.port, address)
