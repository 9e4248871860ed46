"""What a serve-ray deployment is made of: `ClusterSettings` (the `[cluster]` table of the
config file, then the CLI's flags over it) and `ClusterSpec` (what every replica and ingress
replica is built from). No Ray import at module level: the CLI checks a config file before
starting Ray (only [cluster.autoscaling] is checked against Ray's own model, when Ray is there).
The comment above `ClusterSettings` lists every key of the table with its default.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

ROUTERS = ("prefix", "pow2")
TOPOLOGIES = ("auto", "direct", "relay")
DEFAULT_DRAIN_S = 30.0  # runtime.config.RuntimeConfig.drain_timeout's default
# After the drain: the runtimes' actors closing and the device thread joined (a step in flight
# finishes first; a step is a fraction of a second on a CPU, far more on a slow device).
ACTORS_STOP_S = 10.0


class ClusterConfigError(ValueError):
    pass


# The `[cluster]` table (every key optional):
#
#     replicas = 1                 model replicas (ignored when [cluster.autoscaling] is given)
#     ingress_replicas = 1         HTTP ingress replicas (each tokenizes to route by prefix)
#     replica_cpus = 1.0           Ray CPUs reserved per model replica (fractions allowed); leave
#                                  each node a core beyond its replicas' for Ray's own processes
#                                  (docs/scaling-out.md, "Sizing", has what the hop costs with
#                                  and without one). On a local Ray instance
#                                  whatever of replica_cpus and ingress_cpus is left to its
#                                  default is lowered to fit this machine's CPUs (`fit_local`)
#     ingress_cpus = 0.5           ... per ingress replica
#     replica_gpus = 0.0           Ray GPUs per model replica
#     router = "prefix"            "prefix" (runtime/routing.py) or "pow2" (Ray's power of two)
#     topology = "auto"            "relay": Ray's proxy -> SwitchyardIngress -> replicas (what the
#                                  prefix router needs: the ingress reads the prompt); "direct":
#                                  Ray's proxy -> the replicas, no ingress (one process fewer
#                                  on every token's way; routing sees headers, not the prompt);
#                                  "auto": direct for pow2 or one fixed replica, else relay
#     max_ongoing_requests = 1024  per model replica, Ray's own cap; above the runtime's
#                                  max_pending (512) on purpose, so a full replica answers a fast
#                                  429 itself instead of Ray queueing requests silently
#     routing_stats_period_s = 1.0 how often replicas report their load to the routers
#     health_check_period_s = 5.0  how often Ray calls each replica's check_health, which fails
#                                  when its runtime died, its device thread is gone, a step has
#                                  run past the model's step_deadline (--step-deadline, or
#                                  step_deadline in its [[models]] table; 60 s by default), or
#                                  its event loop does not answer; after 3 failures in a row
#                                  (Ray's threshold) the replica is replaced: a stuck step is
#                                  caught about step_deadline + 3 x this after it started, and
#                                  its clients get their error once graceful_shutdown_timeout_s
#                                  has passed too (the stuck replica is stopped, then killed)
#     health_check_timeout_s = 30.0  a check_health call that takes longer counts as failed
#     graceful_shutdown_timeout_s  a replica's whole stop, after which Ray kills it; default the
#                                  models' longest --drain-timeout + 10 s (its actors closing)
#     [cluster.autoscaling]        passed to Ray Serve's autoscaling_config as is:
#                                  min_replicas, max_replicas, target_ongoing_requests,
#                                  upscale_delay_s, downscale_delay_s, ...; checked against
#                                  Ray's AutoscalingConfig first (unknown keys and bad values
#                                  are a config error naming the key)
#     [cluster.router_kwargs]      epsilon, slack, max_kv_usage, min_match, affinity_blocks
#                                  (runtime.routing.RoutingPolicy)
@dataclass
class ClusterSettings:
    replicas: int = 1
    ingress_replicas: int = 1
    replica_cpus: float = 1.0
    ingress_cpus: float = 0.5
    replica_gpus: float = 0.0
    router: str = "prefix"
    topology: str = "auto"
    max_ongoing_requests: int = 1024
    routing_stats_period_s: float = 1.0
    health_check_period_s: float = 5.0
    health_check_timeout_s: float = 30.0
    graceful_shutdown_timeout_s: float | None = None  # None: ClusterSpec.stop_timeout_s
    autoscaling: dict[str, Any] | None = None
    router_kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_table(cls, table: Any, source: str = "config") -> ClusterSettings:
        if not isinstance(table, dict):
            raise ClusterConfigError(f"{source}: [cluster] must be a table")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(table) - known)
        if unknown:
            raise ClusterConfigError(f"{source}: [cluster] has unknown keys {unknown}; known: {sorted(known)}")
        settings = cls(**table)
        settings.check(source)
        return settings

    def check(self, source: str = "config") -> None:
        if self.router not in ROUTERS:
            raise ClusterConfigError(f"{source}: [cluster].router must be one of {ROUTERS}, not {self.router!r}")
        if self.topology not in TOPOLOGIES:
            raise ClusterConfigError(f"{source}: [cluster].topology must be one of {TOPOLOGIES}, not {self.topology!r}")
        if self.topology == "direct" and self.router == "prefix" and self.routes:
            raise ClusterConfigError(
                f"{source}: [cluster].topology 'direct' cannot route by prefix (Ray's proxy never reads the prompt); "
                "use router 'pow2', one replica without autoscaling, or topology 'relay'"
            )
        for name in ("replicas", "ingress_replicas", "max_ongoing_requests"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ClusterConfigError(f"{source}: [cluster].{name} must be a whole number >= 1")
        for name in ("replica_cpus", "ingress_cpus", "replica_gpus", "routing_stats_period_s"):
            if not isinstance(getattr(self, name), (int, float)) or getattr(self, name) < 0:
                raise ClusterConfigError(f"{source}: [cluster].{name} must be a number >= 0")
        for name in ("health_check_period_s", "health_check_timeout_s"):
            if not isinstance(getattr(self, name), (int, float)) or getattr(self, name) <= 0:
                raise ClusterConfigError(f"{source}: [cluster].{name} must be a number > 0")
        stop = self.graceful_shutdown_timeout_s
        if stop is not None and (not isinstance(stop, (int, float)) or stop < 0):
            raise ClusterConfigError(f"{source}: [cluster].graceful_shutdown_timeout_s must be a number >= 0")
        if self.autoscaling is not None:
            check_autoscaling(self.autoscaling, source)

    @property
    def routes(self) -> bool:
        """Whether there is a choice of replica to make (more than one, now or once scaled)."""
        return self.autoscaling is not None or self.replicas > 1

    @property
    def direct(self) -> bool:
        """Ray's proxy calls the replicas themselves (no SwitchyardIngress): asked for, or, on
        "auto", whenever routing does not need the prompt (pow2, or nothing to route)."""
        if self.topology != "auto":
            return self.topology == "direct"
        return self.router == "pow2" or not self.routes


def check_autoscaling(table: Any, source: str) -> None:
    """[cluster.autoscaling] as Ray Serve's AutoscalingConfig takes it, checked here so a typo
    fails before Ray starts: that model ignores unknown keys (a misspelt max_replicas would
    silently be the default) and names a bad value in a pydantic dump."""
    if not isinstance(table, dict):
        raise ClusterConfigError(f"{source}: [cluster.autoscaling] must be a table")
    try:
        from pydantic import ValidationError
        from ray.serve.config import AutoscalingConfig
    except ImportError:  # serve-ray refuses to start without Ray anyway, saying so
        return
    known = set(AutoscalingConfig.model_fields)
    unknown = sorted(set(table) - known)
    if unknown:
        raise ClusterConfigError(f"{source}: [cluster.autoscaling] has unknown keys {unknown}; known: {sorted(known)}")
    try:
        AutoscalingConfig(**table)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'table'}: {e['msg']}" for e in exc.errors())
        raise ClusterConfigError(f"{source}: [cluster.autoscaling] {problems}") from None


# What a reservation is rounded down to when serve-ray sizes it, and the least it will size.
CPU_STEP = 0.01


def fit_local(settings: ClusterSettings, cpus: int, given: set[str]) -> dict[str, Any]:
    """Fit the deployment to a local Ray instance of `cpus` CPUs: Ray never schedules what
    does not fit, so serve-ray would wait forever. Lowers whichever of replica_cpus and
    ingress_cpus is not in `given` (the [cluster] keys and flags the user set) to fit; raises
    ClusterConfigError naming the flags and numbers when what was given can never fit.
    Returns what the ready line reports: the instance's CPUs, and what was lowered."""
    count = int(settings.autoscaling.get("max_replicas", 1)) if settings.autoscaling else settings.replicas
    ingress = 0 if settings.direct else settings.ingress_replicas
    replica, front = settings.replica_cpus, settings.ingress_cpus
    asked = count * replica + ingress * front
    report: dict[str, Any] = {"cpus": cpus}
    if asked <= cpus + 1e-9:
        return report
    fixed = count * replica * ("replica_cpus" in given) + ingress * front * ("ingress_cpus" in given)
    free = asked - fixed  # what sizing may lower
    if fixed > cpus + 1e-9 or free == 0:
        raise ClusterConfigError(f"{_asked(settings, count, ingress)} = {asked:g} Ray CPUs, but this machine's local Ray instance has {cpus}; {_advice(given)}")
    scale = (cpus - fixed) / free
    lowered = {}
    if "replica_cpus" not in given:
        lowered["replica_cpus"] = settings.replica_cpus = _floor(replica * scale)
    if "ingress_cpus" not in given and ingress:
        lowered["ingress_cpus"] = settings.ingress_cpus = _floor(front * scale)
    if any(v < CPU_STEP for v in lowered.values()):
        raise ClusterConfigError(f"{_asked(settings, count, ingress)}: too many replicas for this machine's {cpus} CPUs; lower --replicas")
    return {**report, "lowered_to_fit": lowered}


def _asked(settings: ClusterSettings, count: int, ingress: int) -> str:
    text = f"{'max_replicas' if settings.autoscaling else '--replicas'} {count} x --replica-cpus {settings.replica_cpus:g}"
    return text + (f" + --ingress-replicas {ingress} x ingress_cpus {settings.ingress_cpus:g}" if ingress else "")


def _advice(given: set[str]) -> str:
    flags = [f for f, key in (("--replica-cpus", "replica_cpus"), ("[cluster] ingress_cpus", "ingress_cpus")) if key in given]
    return f"lower {' or '.join(flags) or '--replicas'}, or join a larger cluster with --address"


def _floor(value: float) -> float:
    return round(int(value / CPU_STEP + 1e-9) * CPU_STEP, 2)


@dataclass
class ClusterSpec:
    """Everything a replica needs, shipped to it by Ray (picklable)."""

    models: list[Any]  # runtime.config.RuntimeConfig, one per served model
    platform: Any  # api.http.platform.config.PlatformConfig
    settings: ClusterSettings = field(default_factory=ClusterSettings)
    # A local Ray instance: the CPUs it is started with (`fit_local` sized the settings to
    # them) and what fitting lowered; None when joining a cluster.
    local: dict[str, Any] | None = None

    @property
    def log_level(self) -> str:
        """The command's --log-level, which each model's config carries: a replica's and an
        ingress's process configure their logging with it, as `switchyard serve` does."""
        return str(getattr(self.models[0], "log_level", "info")) if self.models else "info"

    @property
    def drain_timeout(self) -> float:
        """How long a stopping replica gives its live requests (the models' --drain-timeout)."""
        return max((c.drain_timeout for c in self.models), default=DEFAULT_DRAIN_S)

    @property
    def stop_timeout_s(self) -> float:
        """A replica's whole stop (Ray's graceful_shutdown_timeout_s), after which Ray kills it."""
        explicit = self.settings.graceful_shutdown_timeout_s
        return float(explicit) if explicit is not None else self.drain_timeout + ACTORS_STOP_S
