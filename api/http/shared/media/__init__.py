"""Images at the edge: every image part of a request fetched (or read inline), checked and
decoded before the request reaches an engine (`load_images`). Refusals are `InvalidRequest`
400s naming the part; the surface's error shape renders them."""

from api.http.shared.media.load import load_images

__all__ = ["load_images"]
