"""`MediaPolicy`: where the edge may fetch images from, and how much it reads.

Owns the settings of api/http/shared/media/ (the image fetcher) and their three sources, as the
rest of the platform's: the config file's `[platform]` table, then the CLI flags.

- `data:` URIs are always read (capped like any other image).
- `http(s)` URLs only when enabled: `allowed_media_domains` (host names, `*.example.com` for
  its subdomains) or `allow_public_media` (any host). Either way the host must resolve to
  global addresses only: loopback, RFC 1918, link-local (the 169.254.169.254 metadata
  address), CGNAT, IPv4-mapped IPv6 and every other special range are refused, on every
  redirect hop too. `trusted_media_origins` (`http://images.internal:8080`) names origins an
  operator runs on a private network: only those exact scheme, host and port may resolve to a
  private address.
- `file://` URLs only under `media_dir`.
- Caps: bytes per image, decoded pixels per image, seconds per fetch, redirects per fetch.

Imports the standard library only.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

MEDIA_KEYS = (
    "allowed_media_domains", "allow_public_media", "trusted_media_origins", "media_dir",
    "max_image_bytes", "max_image_pixels", "media_timeout_s",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class MediaPolicy:
    allowed_media_domains: tuple[str, ...] = ()
    allow_public_media: bool = False
    trusted_media_origins: tuple[str, ...] = ()
    media_dir: str | None = None
    max_image_bytes: int = 20 * 1024 * 1024
    max_image_pixels: int = 40_000_000  # decoded width x height, checked before decoding
    media_timeout_s: float = 10.0
    max_redirects: int = 3
    # (host, port) -> addresses; None: the system resolver (tests give a fake one)
    resolver: Callable[..., Any] | None = field(default=None, repr=False, compare=False)

    @property
    def fetches_urls(self) -> bool:
        return self.allow_public_media or bool(self.allowed_media_domains) or bool(self.trusted_media_origins)

    def host_allowed(self, host: str) -> bool:
        if self.allow_public_media:
            return True
        host = host.lower().rstrip(".")
        for entry in self.allowed_media_domains:
            entry = entry.lower().rstrip(".")
            if host == entry or (entry.startswith("*.") and host.endswith(entry[1:])):
                return True
        return False

    def trusted(self, origin: str) -> bool:
        return origin.lower() in (o.lower().rstrip("/") for o in self.trusted_media_origins)


def add_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--allowed-media-domains", default=None, metavar="HOSTS", help="comma-separated hosts image URLs may be fetched from (*.example.com: its subdomains); http(s) image URLs are refused without this or --allow-public-media")
    group.add_argument("--allow-public-media", action="store_true", default=None, help="fetch image URLs from any host that resolves to public addresses only (default: off)")
    group.add_argument("--trusted-media-origins", default=None, metavar="ORIGINS", help="comma-separated scheme://host:port origins that may resolve to private addresses (an internal image store); default none")
    group.add_argument("--media-dir", default=None, help="a directory file:// image URLs may read from (default: file:// refused)")
    group.add_argument("--max-image-bytes", type=int, default=None, help="bytes per image, fetched or inline (default 20 MiB)")
    group.add_argument("--max-image-pixels", type=int, default=None, help="width x height per image, checked before decoding (default 40000000)")


def from_args(args: argparse.Namespace, file: Mapping[str, Any] | None = None) -> MediaPolicy:
    settings = dict(file or {})
    flags = {
        "allowed_media_domains": _split(getattr(args, "allowed_media_domains", None)),
        "allow_public_media": getattr(args, "allow_public_media", None),
        "trusted_media_origins": _split(getattr(args, "trusted_media_origins", None)),
        "media_dir": getattr(args, "media_dir", None),
        "max_image_bytes": getattr(args, "max_image_bytes", None),
        "max_image_pixels": getattr(args, "max_image_pixels", None),
    }
    settings.update({k: v for k, v in flags.items() if v is not None})
    return MediaPolicy(**settings)


def file_settings(table: Mapping[str, Any], fail: Callable[[str], Exception]) -> dict[str, Any]:
    """The media keys of a `[platform]` table, checked; `fail(message)` makes the error."""
    out: dict[str, Any] = {}
    for name in ("allowed_media_domains", "trusted_media_origins"):
        if name in table:
            value = table[name]
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                raise fail(f"[platform].{name} must be a list of non-empty strings")
            out[name] = tuple(value)
    if "allow_public_media" in table:
        if not isinstance(table["allow_public_media"], bool):
            raise fail("[platform].allow_public_media must be true or false")
        out["allow_public_media"] = table["allow_public_media"]
    if "media_dir" in table:
        if not isinstance(table["media_dir"], str) or not table["media_dir"]:
            raise fail("[platform].media_dir must be a directory path")
        out["media_dir"] = table["media_dir"]
    for name in ("max_image_bytes", "max_image_pixels", "media_timeout_s"):
        if name in table:
            value = table[name]
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise fail(f"[platform].{name} must be a positive number")
            out[name] = value
    return out


def _split(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    return tuple(part.strip() for part in text.split(",") if part.strip())
