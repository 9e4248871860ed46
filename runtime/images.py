"""Images in a prompt: `ImageInput` (one decoded image, as it travels from the HTTP edge to the
tokenizer actor) and `ImageRef` (an image part as the request named it, before it is fetched).

The edge fetches and decodes every image (api/http/shared/media/) before a request is opened;
the engine never sees a URL. An image travels as raw RGB bytes with its size and a content
hash: the SHA-256 of its size and pixels, so the same picture sent as a PNG and as a
lossless WebP is one image to the encoder cache and the prefix cache, and two pictures never
are. `detail` is the client's resolution hint (OpenAI's and Azure ML's `detail`: auto, low,
high), which the model's processor maps to its own settings where it has one. Pure: msgspec
and hashlib only.
"""

from __future__ import annotations

import hashlib

import msgspec

DETAILS = ("auto", "low", "high")


class ImageRef(msgspec.Struct, frozen=True, kw_only=True):
    """An image part as sent: where to get it, its detail, and the part's path in the body
    (`messages[1].content[2].image_url`), which every refusal names."""

    url: str
    detail: str = "auto"
    param: str = ""


class ImageInput(msgspec.Struct, frozen=True, kw_only=True):
    """One decoded image: RGB pixels, row-major, `width * height * 3` bytes."""

    width: int
    height: int
    pixels: bytes = msgspec.field(default=b"")
    hash: str = ""  # content hash (`content_hash`), hex
    detail: str = "auto"

    def __repr__(self) -> str:  # never the pixels
        return f"ImageInput({self.width}x{self.height}, {self.hash[:12]}, detail={self.detail})"


def content_hash(width: int, height: int, pixels: bytes) -> str:
    """The image's identity: its size and RGB pixels, hashed."""
    digest = hashlib.sha256(f"{width}x{height}:".encode())
    digest.update(pixels)
    return digest.hexdigest()
