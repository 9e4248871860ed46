"""Which addresses an image URL may reach: `check_addresses` resolves a host and refuses it
unless every address is global (public). Special-purpose ranges are refused by Python's own
table (`ipaddress`'s `is_global`: loopback, RFC 1918, link-local with the 169.254.169.254
metadata address, CGNAT 100.64/10, benchmarking, documentation, multicast, reserved...), and
an IPv6 address that carries an IPv4 one (IPv4-mapped ::ffff:a.b.c.d, NAT64, 6to4, Teredo)
is judged by the IPv4 address inside it. The caller connects to the address checked here, not
to the name again (no second lookup a DNS rebinding could answer differently). Imports trio.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from typing import Any

import trio

from runtime.errors import InvalidRequest

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    return None


def is_public(address: IPAddress) -> bool:
    inner = embedded_ipv4(address)
    if inner is not None:
        return inner.is_global and not inner.is_multicast
    return address.is_global and not address.is_multicast


async def resolve(host: str, port: int, resolver: Callable[..., Any] | None = None) -> list[IPAddress]:
    """Every address `host` resolves to (an IP literal is itself)."""
    try:
        return [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        pass
    if resolver is not None:
        found = await resolver(host, port)
        return [ipaddress.ip_address(a) for a in found]
    infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]


async def check_addresses(host: str, port: int, param: str, private_ok: bool, resolver: Callable[..., Any] | None = None) -> IPAddress:
    """The address to connect to: the first of `host`'s, all of which must be public unless
    `private_ok` (a trusted origin). InvalidRequest naming `param` otherwise."""
    try:
        addresses = await resolve(host, port, resolver)
    except (OSError, UnicodeError, ValueError):
        raise InvalidRequest(f"The image URL's host {host!r} could not be resolved.", param=param, code="invalid_image_url") from None
    if not addresses:
        raise InvalidRequest(f"The image URL's host {host!r} has no address.", param=param, code="invalid_image_url")
    if not private_ok:
        for address in addresses:
            if not is_public(address):
                raise InvalidRequest(
                    f"The image URL's host {host!r} resolves to {address}, which is not a public address; images are fetched from public hosts only.",
                    param=param,
                    code="image_url_refused",
                )
    return addresses[0]
