"""Image content parts, as Chat and Responses send them → `ImageRef`s and the chat template's
image marker, and the loading step both views share.

Chat (OpenAI, Azure ML, Databricks): `{"type": "image_url", "image_url": {"url": ..., "detail":
"auto" | "low" | "high"}}` (a bare string `image_url` too). Responses: `{"type": "input_image",
"image_url": "<url or data URI>", "detail": ...}`. A model that reads text only refuses them
with a 400 naming the part, as before; a vision-language model gets `{"type": "image"}` in the
message content where the image goes, in the order the images are listed. Imports
api.http.shared and runtime.
"""

from __future__ import annotations

from typing import Any

import msgspec

from api.http.platform.media import MediaPolicy
from api.http.shared.media import load_images
from runtime.errors import InvalidRequest
from runtime.images import DETAILS, ImageRef
from runtime.protocol import Runtime
from runtime.request import Prompt

MARKER = {"type": "image"}


def text_only(kind: str, param: str) -> InvalidRequest:
    return InvalidRequest(f"Content parts of type {kind!r} need a multimodal model; this model reads text only.", param=param, code="unsupported_content")


def image_ref(image_url: Any, detail: Any, param: str) -> ImageRef:
    """An image part's URL and detail; `param` names its `image_url`."""
    url = image_url
    if isinstance(image_url, dict):
        url, detail = image_url.get("url"), image_url.get("detail", detail)
        detail_param = f"{param}.detail"
    else:
        detail_param = param.rsplit(".", 1)[0] + ".detail"
    if not isinstance(url, str) or not url:
        raise InvalidRequest("An image part needs image_url: a URL or a data: URI.", param=param if isinstance(image_url, str) or image_url is None else f"{param}.url")
    detail = "auto" if detail is None else detail
    if detail not in DETAILS:
        raise InvalidRequest(f"detail must be one of {', '.join(DETAILS)}.", param=detail_param)
    return ImageRef(url=url, detail=detail, param=param)


async def with_images(prompt: Prompt, refs: tuple[ImageRef, ...], runtime: Runtime, policy: MediaPolicy) -> Prompt:
    """`prompt` with its images fetched and decoded (a 400 naming the first part that fails)."""
    if not refs:
        return prompt
    images = await load_images(refs, policy, runtime.max_images_per_prompt)
    return msgspec.structs.replace(prompt, images=images)
