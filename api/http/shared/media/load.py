"""`load_images`: a request's image parts → decoded `ImageInput`s, in order, or a 400 naming
the first part that cannot be had.

`data:` URIs (base64) are always read; http(s) and file:// URLs as the `MediaPolicy` allows
(fetch.py). Every image is capped in bytes and in pixels, and a prompt in images
(`max_images`, the model's `--limit-images-per-prompt`). Nothing reaches an engine until
every image has been fetched and decoded. Imports trio and runtime.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence

import trio

from api.http.platform.media import MediaPolicy
from api.http.shared.media.decode import decode_image, decode_in_thread
from api.http.shared.media.fetch import fetch_url, read_file_url
from runtime.errors import InvalidRequest
from runtime.images import ImageInput, ImageRef


async def load_images(refs: Sequence[ImageRef], policy: MediaPolicy, max_images: int) -> tuple[ImageInput, ...]:
    if len(refs) > max_images:
        raise InvalidRequest(
            f"This model reads at most {max_images} images per prompt; the request has {len(refs)}.",
            param=refs[max_images].param,
            code="too_many_images",
        )
    images = []
    for ref in refs:
        images.append(await _image(ref, policy))
    return tuple(images)


async def _image(ref: ImageRef, policy: MediaPolicy) -> ImageInput:
    url = ref.url.strip()
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        # Base64 and pixels in one worker-thread hop: the event loop, whose every stream's
        # chunks wait out what it does, does no per-byte work.
        return await trio.to_thread.run_sync(decode_data_uri, ref, policy)
    if scheme in ("http", "https"):
        data = await fetch_url(url, policy, ref.param)
    elif scheme == "file":
        data = await trio.to_thread.run_sync(read_file_url, url, policy, ref.param)
    else:
        raise InvalidRequest("An image is a data: URI (base64) or an http(s) URL.", param=ref.param, code="invalid_image_url")
    return await decode_in_thread(data, policy.max_image_pixels, ref.param, ref.detail)


def decode_data_uri(ref: ImageRef, policy: MediaPolicy) -> ImageInput:
    """A `data:` image part, base64 to pixels, under the policy's caps (blocking: a worker thread's)."""
    return decode_image(data_uri_bytes(ref.url.strip(), policy.max_image_bytes, ref.param), policy.max_image_pixels, ref.param, ref.detail)


def data_uri_bytes(url: str, cap: int, param: str) -> bytes:
    head, comma, payload = url.partition(",")
    if not comma or ";base64" not in head.lower():
        raise InvalidRequest("A data: image URI must be base64: data:image/png;base64,....", param=param, code="invalid_image_url")
    if len(payload) > cap * 4 // 3 + 4:
        raise InvalidRequest(f"The image is over {cap} bytes.", param=param, code="image_too_large")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest("The data: image URI is not valid base64.", param=param, code="invalid_image_url") from None
