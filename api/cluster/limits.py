"""Per-key rate limits that hold across every replica of a serve-ray deployment.

Owns: `RateLimitActor`, one named Ray actor holding the deployment's token buckets (the very
`api.http.shared.auth.RateLimiter` a single node uses), and `SharedRateLimiter`, the replica-side stand-in
that `api.http.shared.auth.AuthMiddleware` calls instead of its own buckets. Everything else about limits
(who a request is, the token estimate, the 429 and its shape, correcting the charge to the
usage the response reported) stays in AuthMiddleware on the replica, written once.

Exact, not approximated: every admission is one call on one actor, and a synchronous Ray
actor runs its calls one at a time, so two replicas never both spend the last request of a
bucket. The cost is one actor round trip per admitted request (a local call, about a
millisecond), paid only when limits are configured, off the replica's event loop (a worker
thread waits for it). Corrections after a response (`settle`) are sent without waiting.
If the actor cannot be reached, the request is admitted (logged): a limiter outage must not
become a serving outage. Imports ray, trio and api.
"""

from __future__ import annotations

from typing import Any

import trio

from api.http.shared.auth import RateLimiter
from runtime.logging import get_logger

log = get_logger("cluster.limits")

ACTOR_NAME = "switchyard-rate-limits"
NAMESPACE = "switchyard"


class RateLimitActor:
    def __init__(self, config: Any) -> None:
        self.configure(config)

    def configure(self, config: Any) -> None:
        """New limits (a redeploy changed them): fresh buckets; the same limits keep theirs."""
        limits = (config.requests_per_minute, config.tokens_per_minute)
        if getattr(self, "_limits", None) != limits:
            self._limits = limits
            self.limiter = RateLimiter(config)

    def admit(self, who: str, tokens: int) -> tuple[float, str]:
        return self.limiter.admit(who, tokens)

    def settle(self, who: str, charged: int, used: int) -> None:
        self.limiter.settle(who, charged, used)


def rate_limit_actor(config: Any) -> Any:
    import ray

    remote = ray.remote(num_cpus=0, max_restarts=-1)(RateLimitActor)
    actor = remote.options(name=ACTOR_NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True).remote(config)
    actor.configure.remote(config)
    return actor


class SharedRateLimiter:
    """api.http.shared.auth.RateLimiter's interface over the actor; `admit` is awaited by AuthMiddleware."""

    def __init__(self, actor: Any, config: Any) -> None:
        self.actor = actor
        self.config = config

    @property
    def enabled(self) -> bool:
        return self.config.requests_per_minute is not None or self.config.tokens_per_minute is not None

    async def admit(self, who: str, tokens: int) -> tuple[float, str]:
        import ray

        try:
            return await trio.to_thread.run_sync(ray.get, self.actor.admit.remote(who, tokens), abandon_on_cancel=True)
        except (ray.exceptions.RayError, OSError) as exc:
            log.error("rate_limiter_unreachable", error=repr(exc)[:300])
            return 0.0, ""

    def settle(self, who: str, charged: int, used: int) -> None:
        if used != charged:
            self.actor.settle.remote(who, charged, used)  # not awaited: runs in cancelled scopes too
