"""Fetching one image URL safely: `fetch_url` (http, https) and `read_file_url` (file://).

Each hop of an http(s) fetch: the scheme must be http or https; the host must be allowed by
the policy (an allow-listed domain, any host when public media is on, or a trusted origin);
the name is resolved once and every address checked (addresses.py), and the connection goes
to the checked address (with the name only as the Host header and TLS's SNI and certificate
check), so a second lookup can never swap in another address. A redirect (301, 302, 303, 307,
308) starts a new hop with the same checks, at most `max_redirects` of them. The body is read
up to `max_image_bytes` (a longer one is refused as soon as it passes the cap, as is a
Content-Length over it), and the whole fetch, every hop included, within `media_timeout_s`.
HTTP/1.1 over trio with h11, no connection reuse. Imports trio, h11 and runtime.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from urllib.parse import SplitResult, unquote, urljoin, urlsplit

import h11
import trio

from api.http.platform.media import MediaPolicy
from api.http.shared.media.addresses import check_addresses
from runtime.errors import InvalidRequest

REDIRECTS = (301, 302, 303, 307, 308)
_CHUNK = 65536


def _refuse(message: str, param: str, code: str = "image_url_refused") -> InvalidRequest:
    return InvalidRequest(message, param=param, code=code)


async def fetch_url(url: str, policy: MediaPolicy, param: str) -> bytes:
    """The body of `url`, following checked redirects."""
    if not policy.fetches_urls:
        raise _refuse("Image URLs are not fetched by this server; send the image inline as a data: URI (base64).", param)
    try:
        with trio.fail_after(policy.media_timeout_s):
            for _ in range(policy.max_redirects + 1):
                status, location, body = await _hop(url, policy, param)
                if status not in REDIRECTS:
                    if status != 200:
                        raise _refuse(f"Fetching the image gave HTTP {status}.", param, "image_fetch_failed")
                    return body
                if not location:
                    raise _refuse(f"Fetching the image gave HTTP {status} without a Location.", param, "image_fetch_failed")
                url = urljoin(url, location)
    except trio.TooSlowError:
        raise _refuse(f"Fetching the image took longer than {policy.media_timeout_s:g} s.", param, "image_fetch_timeout") from None
    raise _refuse(f"Fetching the image was redirected more than {policy.max_redirects} times.", param)


async def _hop(url: str, policy: MediaPolicy, param: str) -> tuple[int, str | None, bytes]:
    parts = urlsplit(url)
    scheme, host = parts.scheme.lower(), parts.hostname
    if scheme not in ("http", "https") or not host:
        raise _refuse(f"Image URLs must be http(s) or data: URIs; a redirect or URL led to {scheme or 'no'} scheme.", param)
    if parts.username or parts.password:
        raise _refuse("Image URLs may not carry credentials.", param)
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:
        raise _refuse("The image URL's port is not valid.", param, "invalid_image_url") from None
    trusted = policy.trusted(f"{scheme}://{host}:{port}") or (parts.port is None and policy.trusted(f"{scheme}://{host}"))
    if not trusted and not policy.host_allowed(host):
        raise _refuse(f"Image URLs from {host!r} are not allowed on this server.", param)
    address = await check_addresses(host, port, param, private_ok=trusted, resolver=policy.resolver)
    try:
        stream: trio.abc.Stream = await trio.open_tcp_stream(str(address), port)
    except OSError as exc:
        raise _refuse(f"Could not connect to the image host: {exc.strerror or exc}.", param, "image_fetch_failed") from None
    async with stream:
        if scheme == "https":
            stream = trio.SSLStream(stream, ssl.create_default_context(), server_hostname=host, https_compatible=True)
        try:
            return await _exchange(stream, host if parts.port is None else f"{host}:{port}", parts, policy.max_image_bytes, param)
        except (trio.BrokenResourceError, ssl.SSLError, h11.ProtocolError, OSError) as exc:
            raise _refuse(f"Fetching the image failed: {type(exc).__name__}.", param, "image_fetch_failed") from None


async def _exchange(stream: trio.abc.Stream, host_header: str, parts: SplitResult, cap: int, param: str) -> tuple[int, str | None, bytes]:
    conn = h11.Connection(our_role=h11.CLIENT)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    request = h11.Request(method="GET", target=target, headers=[("Host", host_header), ("User-Agent", "switchyard-media"), ("Accept", "image/*"), ("Connection", "close")])
    await stream.send_all(conn.send(request) + conn.send(h11.EndOfMessage()))
    status, location, body = 0, None, bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(_CHUNK)
            conn.receive_data(bytes(data))
            continue
        if isinstance(event, h11.Response):
            status = event.status_code
            headers = {name.decode().lower(): value.decode("latin-1") for name, value in event.headers}
            location = headers.get("location")
            length = headers.get("content-length")
            if status == 200 and length is not None and length.isdigit() and int(length) > cap:
                raise _refuse(f"The image is {int(length)} bytes; at most {cap} are read.", param, "image_too_large")
            if status != 200:
                return status, location, b""
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > cap:
                raise _refuse(f"The image is over {cap} bytes; at most {cap} are read.", param, "image_too_large")
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            return status, location, bytes(body)


def read_file_url(url: str, policy: MediaPolicy, param: str) -> bytes:
    """A file:// URL's bytes, only from inside `media_dir` (symlinks resolved first). Worker thread."""
    if policy.media_dir is None:
        raise _refuse("file:// image URLs are not read by this server.", param)
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise _refuse("file:// image URLs name a local path only.", param)
    root = Path(policy.media_dir).resolve()
    path = Path(unquote(parts.path)).resolve()
    if not path.is_relative_to(root):
        raise _refuse("The file is outside the directory images may be read from.", param)
    if not path.is_file():  # not a FIFO or a device, which could block or never end
        raise _refuse("The image path is not a file.", param)
    try:
        with open(path, "rb") as f:
            data = f.read(policy.max_image_bytes + 1)
    except OSError:
        raise _refuse("The image file could not be read.", param, "invalid_image_url") from None
    if len(data) > policy.max_image_bytes:
        raise _refuse(f"The image is over {policy.max_image_bytes} bytes.", param, "image_too_large")
    return data
