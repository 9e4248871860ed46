"""`PlatformConfig`: the knobs of the platform surface (API keys, per-key limits, state,
endpoints declared in the config file).

Owns: the settings of api/http/shared/auth.py (Bearer keys, requests and tokens per minute per key),
where api/http/databricks/store.py keeps serving-endpoint definitions, and the endpoints a config
file declares. Built from three layers, later ones winning (keys add up across all three): the
config file's `[platform]` table (`file_settings`), the environment (`from_env`), then the CLI
flags `add_arguments` defines (`from_args`). `from_env` alone is what `create_app` uses when
given no config. docs/operations.md says the same for operators.

A variable named in api_keys_env that is unset or empty stops the server (no silent open
server). Keys are never shown: `repr()` prints how many there are, not what they are.
Imports the standard library and runtime. The `[[endpoints]]` tables are read by the surface
they configure (api/http/databricks/declared.py), which this module does not import.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from api.http.platform import media
from api.http.platform.media import MediaPolicy
from runtime.logging import get_logger
from runtime.model_store import store_root

ENDPOINTS_DB = "serving_endpoints.sqlite3"
PLATFORM_KEYS = ("api_keys_env", "api_keys", "requests_per_minute", "tokens_per_minute", "state_dir", *media.MEDIA_KEYS)


class ConfigError(ValueError):
    """A config file (or the settings it names) that cannot be served; the message says where."""


@dataclass(frozen=True, slots=True)
class PlatformConfig:
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    state_dir: str | None = None
    # one endpoint request per [[endpoints]] table of the config file (api/http/databricks/declared.py)
    endpoints: tuple[Any, ...] = ()
    # Where serving endpoints are stored (load/put/delete, as api.http.databricks.store.EndpointStore);
    # None: the SQLite file at endpoints_db. A serve-ray replica passes the cluster's shared store.
    endpoint_store: Any = field(default=None, repr=False, compare=False)
    # Per-key limits (admit / settle, as api.http.shared.auth.RateLimiter); None: this process's own buckets.
    # A serve-ray replica passes the deployment's shared ones (api/cluster/limits.py).
    rate_limiter: Any = field(default=None, repr=False, compare=False)
    # LoRA adapters loaded at run time, published to every replica (publish(name, path or None),
    # api/cluster/config_store.py); None: this process's alone.
    adapter_sync: Any = field(default=None, repr=False, compare=False)
    # What GET /metrics answers (an awaitable of the exposition); None: this process's metrics.
    # With several front ends (`--api-servers`), every process's, merged (api/process/hub.py).
    metrics_view: Any = field(default=None, repr=False, compare=False)
    # Where image URLs may be fetched from, and the caps (api/http/platform/media.py).
    media: MediaPolicy = field(default_factory=MediaPolicy)

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
            f"tokens_per_minute={self.tokens_per_minute}, state_dir={self.state_dir!r}, endpoints={[e.name for e in self.endpoints]})"
        )

    @property
    def endpoints_db(self) -> Path:
        if self.state_dir:
            return Path(self.state_dir).expanduser() / ENDPOINTS_DB
        return store_root() / ENDPOINTS_DB

    # The environment:
    #     SWITCHYARD_API_KEYS        comma-separated Bearer keys; none anywhere: an open server
    #     SWITCHYARD_RATE_LIMIT_RPM  requests per minute per key
    #     SWITCHYARD_RATE_LIMIT_TPM  tokens (prompt + completion) per minute per key
    #     SWITCHYARD_STATE_DIR       directory of serving_endpoints.sqlite3 (default: the model store)
    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        api_keys: Iterable[str] = (),
        file: Mapping[str, Any] | None = None,
        endpoints: Iterable[Any] = (),
        **overrides: object,
    ) -> PlatformConfig:
        """The environment's settings over `file` (a `file_settings` dict); `api_keys` (e.g.
        repeated --api-key) add to the file's and the env's keys, and any other keyword given
        (not None) replaces both."""
        env = os.environ if environ is None else environ
        file = dict(file or {})
        keys = list(file.pop("api_keys", ()))
        keys += [k for k in _split(env.get("SWITCHYARD_API_KEYS", "")) if k not in keys]
        keys += [k for k in api_keys if k not in keys]
        settings: dict[str, Any] = {k: v for k, v in file.items() if k not in media.MEDIA_KEYS}
        if "media" not in overrides:
            settings["media"] = MediaPolicy(**{k: v for k, v in file.items() if k in media.MEDIA_KEYS})
        from_environment = {
            "requests_per_minute": _int(env.get("SWITCHYARD_RATE_LIMIT_RPM")),
            "tokens_per_minute": _int(env.get("SWITCHYARD_RATE_LIMIT_TPM")),
            "state_dir": env.get("SWITCHYARD_STATE_DIR") or None,
        }
        settings.update({k: v for k, v in from_environment.items() if v is not None})
        settings.update({k: v for k, v in overrides.items() if v is not None})
        return cls(api_keys=tuple(keys), endpoints=tuple(endpoints), **settings)


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
    media.add_arguments(parser.add_argument_group("images: where image URLs may be fetched from, and the caps"))


def from_args(args: argparse.Namespace, file: Mapping[str, Any] | None = None, endpoints: Iterable[Any] = ()) -> PlatformConfig:
    """Flags from `add_arguments` over the environment over the config file's `file_settings`:
    keys add up, the rest override."""
    media_file = {k: v for k, v in (file or {}).items() if k in media.MEDIA_KEYS}
    return PlatformConfig.from_env(
        api_keys=args.api_key, file=file, endpoints=endpoints,
        requests_per_minute=args.rate_limit_rpm, tokens_per_minute=args.rate_limit_tpm, state_dir=args.state_dir,
        media=media.from_args(args, media_file),
    )


# The config file's `[platform]` table:
#     api_keys_env = ["TEAM_A_KEY", "TEAM_B_KEY"]  # names of environment variables holding keys
#     api_keys = ["sk-..."]                          # literal keys (allowed, warned: prefer _env)
#     requests_per_minute = 600
#     tokens_per_minute = 200000
#     state_dir = "/var/lib/switchyard"
# A variable named in api_keys_env may hold several keys, comma-separated. Unknown keys are refused.
def file_settings(table: Any, environ: Mapping[str, str] | None = None, source: str = "config") -> dict[str, Any]:
    """The `[platform]` table of a config file → keyword settings for `from_env(file=...)`.
    Raises ConfigError (naming `source` and the key) on anything it does not understand."""
    env = os.environ if environ is None else environ
    if not isinstance(table, Mapping):
        raise ConfigError(f"{source}: [platform] must be a table")
    unknown = sorted(set(table) - set(PLATFORM_KEYS))
    if unknown:
        raise ConfigError(f"{source}: [platform] has unknown keys {unknown}; known: {list(PLATFORM_KEYS)}")
    settings: dict[str, Any] = {}
    keys: list[str] = []
    for name in _strings(table.get("api_keys_env", []), source, "api_keys_env"):
        value = _split(env.get(name, ""))
        if not value:
            raise ConfigError(f"{source}: [platform].api_keys_env names {name}, which is not set (or empty) in the environment")
        keys += [k for k in value if k not in keys]
    literal = _strings(table.get("api_keys", []), source, "api_keys")
    if literal:
        get_logger("config").warning("api_keys_in_config_file", source=source, count=len(literal), hint="prefer api_keys_env")
    keys += [k for k in literal if k not in keys]
    if keys:
        settings["api_keys"] = tuple(keys)
    for name in ("requests_per_minute", "tokens_per_minute"):
        if name in table:
            value = table[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{source}: [platform].{name} must be a whole number of at least 1")
            settings[name] = value
    if "state_dir" in table:
        if not isinstance(table["state_dir"], str) or not table["state_dir"]:
            raise ConfigError(f"{source}: [platform].state_dir must be a directory path")
        settings["state_dir"] = table["state_dir"]
    settings.update(media.file_settings(table, lambda message: ConfigError(f"{source}: {message}")))
    return settings


def _strings(value: Any, source: str, name: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f"{source}: [platform].{name} must be a list of non-empty strings")
    return value


def _split(text: str) -> list[str]:
    return [k.strip() for k in text.split(",") if k.strip()]


def _int(text: str | None) -> int | None:
    return int(text) if text not in (None, "") else None
