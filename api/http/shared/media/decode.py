"""Image bytes → `ImageInput`: Pillow, in a worker thread, with the decompression bomb kept out.

The header is read first (`Image.open` is lazy) and the declared width x height checked
against `max_image_pixels` before any pixel is decoded, so a small file that declares a huge
canvas never allocates it; Pillow's own bomb check (its warning and error) is turned into the
same refusal. Only still images of the formats Pillow reads by default; an animated one gives
its first frame. The pixels are converted to RGB (alpha dropped onto white, as browsers show
it) and hashed (runtime/images.py). A truncated or corrupt file is refused, not padded. Imports
Pillow, trio and runtime.
"""

from __future__ import annotations

import io
import warnings
from typing import Any

import trio

from runtime.errors import InvalidRequest
from runtime.images import ImageInput, content_hash

FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")


def decode_image(data: bytes, max_pixels: int, param: str, detail: str = "auto") -> ImageInput:
    from PIL import Image

    if not data:
        raise InvalidRequest("The image is empty.", param=param, code="invalid_image")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=FORMATS)
            width, height = image.size
            if width <= 0 or height <= 0 or width * height > max_pixels:
                raise InvalidRequest(
                    f"The image is {width}x{height} pixels; at most {max_pixels} pixels are decoded.", param=param, code="image_too_large"
                )
            image.load()
            rgb = _rgb(image)
    except InvalidRequest:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise InvalidRequest(f"The image is too large to decode (at most {max_pixels} pixels).", param=param, code="image_too_large") from None
    except Exception as exc:  # Pillow raises OSError, SyntaxError, ValueError... on bad data
        raise InvalidRequest(f"The image could not be decoded: {type(exc).__name__}: {exc}", param=param, code="invalid_image") from None
    pixels = rgb.tobytes()
    return ImageInput(width=rgb.width, height=rgb.height, pixels=pixels, hash=content_hash(rgb.width, rgb.height, pixels), detail=detail)


def _rgb(image: Any) -> Any:
    from PIL import Image

    if image.mode == "RGB":
        return image
    if image.mode in ("RGBA", "LA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


async def decode_in_thread(data: bytes, max_pixels: int, param: str, detail: str = "auto") -> ImageInput:
    return await trio.to_thread.run_sync(decode_image, data, max_pixels, param, detail)
