"""`PlatformConfig`: the knobs of the platform surface (API keys, per-key limits, state).

Owns: the settings of api/auth.py (Bearer keys, requests and tokens per minute per key) and
where api/endpoints_store.py keeps serving-endpoint definitions. Built from the flags that
`add_arguments` defines (`from_args`: flags over the environment), or from the environment alone
(`from_env`, what `create_app` uses when given no config):

    SWITCHYARD_API_KEYS        comma-separated Bearer keys; none: an open server
    SWITCHYARD_RATE_LIMIT_RPM  requests per minute per key
    SWITCHYARD_RATE_LIMIT_TPM  tokens (prompt + completion) per minute per key
    SWITCHYARD_STATE_DIR       directory of serving_endpoints.sqlite3 (default: the model store)

Keys are never shown: `repr()` prints how many there are, not what they are.
Imports the standard library and runtime.model_store.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

ENDPOINTS_DB = "serving_endpoints.sqlite3"


@dataclass(frozen=True, slots=True)
class PlatformConfig:
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    state_dir: str | None = None

    def __post_init__(self) -> None:
        if any(not key or key != key.strip() for key in self.api_keys):
            raise ValueError("API keys must be non-empty and carry no surrounding whitespace")
        for name in ("requests_per_minute", "tokens_per_minute"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1")

    def __repr__(self) -> str:
        return (
            f"PlatformConfig(api_keys=<{len(self.api_keys)} keys>, requests_per_minute={self.requests_per_minute}, "
            f"tokens_per_minute={self.tokens_per_minute}, state_dir={self.state_dir!r})"
        )

    @property
    def endpoints_db(self) -> Path:
        if self.state_dir:
            return Path(self.state_dir).expanduser() / ENDPOINTS_DB
        from runtime.model_store import store_root

        return store_root() / ENDPOINTS_DB

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, api_keys: Iterable[str] = (), **overrides: object) -> PlatformConfig:
        """The environment's settings; `api_keys` (e.g. repeated --api-key) add to the env's keys,
        and any other keyword given (not None) replaces the env's value."""
        env = os.environ if environ is None else environ
        keys = [k.strip() for k in env.get("SWITCHYARD_API_KEYS", "").split(",") if k.strip()]
        keys += [k for k in api_keys if k not in keys]
        settings: dict[str, object] = {
            "requests_per_minute": _int(env.get("SWITCHYARD_RATE_LIMIT_RPM")),
            "tokens_per_minute": _int(env.get("SWITCHYARD_RATE_LIMIT_TPM")),
            "state_dir": env.get("SWITCHYARD_STATE_DIR") or None,
        }
        settings.update({k: v for k, v in overrides.items() if v is not None})
        return cls(api_keys=tuple(keys), **settings)  # type: ignore[arg-type]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The CLI flags of these knobs (for `switchyard serve`); read them back with `from_args`."""
    group = parser.add_argument_group("platform: API keys, rate limits, serving endpoints")
    group.add_argument(
        "--api-key", action="append", default=[], metavar="KEY",
        help="a Bearer key clients must send; repeatable. Prefer SWITCHYARD_API_KEYS (comma-separated): "
        "command lines are visible to other users. No key anywhere: the server is open",
    )
    group.add_argument("--rate-limit-rpm", type=int, default=None, metavar="N", help="requests per minute per key (default: no limit)")
    group.add_argument("--rate-limit-tpm", type=int, default=None, metavar="N", help="prompt + completion tokens per minute per key (default: no limit)")
    group.add_argument("--state-dir", default=None, help=f"where serving-endpoint definitions persist ({ENDPOINTS_DB}); default: the model store")


def from_args(args: argparse.Namespace) -> PlatformConfig:
    """Flags from `add_arguments` over the environment: keys add up, the rest override."""
    return PlatformConfig.from_env(
        api_keys=args.api_key, requests_per_minute=args.rate_limit_rpm, tokens_per_minute=args.rate_limit_tpm, state_dir=args.state_dir
    )


def _int(text: str | None) -> int | None:
    return int(text) if text not in (None, "") else None
