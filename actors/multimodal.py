"""A prompt with images → the token ids the model sees and what its vision encoder needs.

Owns: `ImagePrompts`, the tokenizer actor's helper for vision-language models. The model's own
processor renders the chat template (an image part becomes the template's image marker),
resizes and normalises each image and expands each marker into the image's placeholder
tokens; `family` says how its arrays split per image and how many placeholder tokens each
image has. Out come the ids and a `MultiModalPrompt`: per image its arrays, its placeholder
runs and its hash (the image's content hash, and the `detail` it was processed at where
`detail` changes the processing). Runs in the tokenizer actor's worker thread. Imports numpy,
Pillow (through the processor) and runtime.

What `detail` does per family: LLaVA resizes every image to its vision tower's one input size,
so `detail` changes nothing. Qwen2-VL's resolution follows the image (Qwen2.5-VL's too: its
processing is Qwen2-VL's, and all said of Qwen2-VL here holds for it): `low` (on every image of the prompt) caps
each at `LOW_DETAIL_PIXELS` (at most 256 tokens), or a quarter of the processor's own bound
where that is smaller; `high` and `auto` use the processor's own bounds (a prompt mixing `low`
with others is processed at the processor's bounds). Idefics3 (SmolVLM) splits an image into
tiles plus a global view, each tile `image_seq_len` tokens: `low` (on every image of the prompt)
turns the splitting off, so each image is its global view alone; `high` and `auto` split as the
processor does.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

import numpy as np

from runtime.errors import InvalidRequest
from runtime.images import ImageInput
from runtime.messages import ImageFeatures, MultiModalPrompt
from runtime.model_store import MROPE_MODEL_TYPES, VISION_MODEL_TYPES
from runtime.request import Prompt

FAMILIES = VISION_MODEL_TYPES
LOW_DETAIL_PIXELS = 256 * 28 * 28


class ImagePrompts:
    def __init__(self, processor: Any, family: str) -> None:
        if family not in FAMILIES:
            raise ValueError(f"no image prompts for {family!r}")
        self.processor = processor
        self.family = family
        tokenizer = processor.tokenizer
        self.image_token_id = int(getattr(processor, "image_token_id", None) or tokenizer.convert_tokens_to_ids(processor.image_token))

    @functools.cached_property
    def max_tokens_per_image(self) -> int:
        """The most placeholder tokens one image takes (token-budget admission charges it per
        image before the prompt is processed): the processor's count for a large image."""
        try:
            counts = self.processor._get_num_multimodal_tokens(image_sizes=[[4096, 4096]])
            return int(counts["num_image_tokens"][0])
        except Exception:  # a processor without the count: a typical image's
            return 576

    def encode(self, prompt: Prompt, prefix: str = "") -> tuple[list[int], MultiModalPrompt]:
        """A message prompt with `prompt.images` → (ids, its images)."""
        assert prompt.messages is not None
        try:
            text = self.processor.apply_chat_template(prompt.messages, tokenize=False, add_generation_prompt=True, **prompt.chat_template_kwargs)
        except Exception as exc:
            raise InvalidRequest(f"The chat template rejected these messages: {exc}", param="messages") from exc
        pil = [_pil(image) for image in prompt.images]
        kwargs = self._image_kwargs(prompt.images)
        try:
            out = self.processor(text=[text + prefix], images=pil, return_tensors="np", add_special_tokens=False, **kwargs)
        except (ValueError, TypeError) as exc:
            raise InvalidRequest(f"The model's processor refused the images: {exc}", param="messages") from exc
        ids = [int(t) for t in out["input_ids"][0]]
        arrays = self._split(out, len(pil))
        counts = self._tokens_per_image(out, len(pil))
        runs = _runs(ids, self.image_token_id, counts)
        images = tuple(
            ImageFeatures(hash=self._feature_hash(image), runs=image_runs, arrays=image_arrays)
            for image, image_runs, image_arrays in zip(prompt.images, runs, arrays)
        )
        if self.family not in MROPE_MODEL_TYPES:
            return ids, MultiModalPrompt(images=images)
        grids = [(int(a["image_grid_thw"][0][0]), int(a["image_grid_thw"][0][1]), int(a["image_grid_thw"][0][2])) for a in arrays]
        positions, delta = mrope_positions(len(ids), [r[0] for r in runs], grids, self._merge)
        return ids, MultiModalPrompt(images=images, mrope_positions=positions, mrope_delta=delta)

    def _idefics3_tiles(self, out: Any) -> list[int]:
        """How many tiles each image has, read from the ids: an image's tiles are runs of
        `image_seq_len` placeholders, its last one (the global view) after `<global-img>`."""
        ids = [int(t) for t in out["input_ids"][0]]
        size = int(self.processor.image_seq_len)
        global_id = int(self.processor.global_image_token_id)
        counts, tiles = [], 0
        for i, t in enumerate(ids):
            if t == self.image_token_id and ids[i - 1] != self.image_token_id:  # a tile's first placeholder
                tiles += 1
                if ids[i - 1] == global_id:
                    counts.append(tiles)
                    tiles = 0
        if any(count * size == 0 for count in counts):
            raise InvalidRequest("The processor's image placeholders are not in tiles.", param="messages")
        return counts

    @property
    def _merge(self) -> int:
        return int(getattr(self.processor.image_processor, "merge_size", 2))

    def _image_kwargs(self, images: tuple[ImageInput, ...]) -> dict[str, Any]:
        if self.family == "idefics3" and images and all(image.detail == "low" for image in images):
            return {"images_kwargs": {"do_image_splitting": False}}
        if self.family in MROPE_MODEL_TYPES and images and all(image.detail == "low" for image in images):
            processor = self.processor.image_processor
            bounds = getattr(processor, "size", None) or {}
            most = int(bounds.get("longest_edge") or getattr(processor, "max_pixels", None) or LOW_DETAIL_PIXELS * 4)
            least = int(bounds.get("shortest_edge") or getattr(processor, "min_pixels", None) or 56 * 56)  # the processors' own default
            # `size`, not `max_pixels`: transformers 5.17 ignores a `max_pixels` given per call
            # (found on the GPU image), and 5.23 deprecates it.
            return {"images_kwargs": {"size": {"shortest_edge": least, "longest_edge": max(least, min(LOW_DETAIL_PIXELS, most // 4))}}}
        return {}

    def _feature_hash(self, image: ImageInput) -> str:
        if self.family != "llava" and image.detail == "low":
            return hashlib.sha256(f"{image.hash}:low".encode()).hexdigest()
        return image.hash

    def _split(self, out: Any, count: int) -> list[dict[str, Any]]:
        pixels = np.asarray(out["pixel_values"])
        if self.family == "llava":
            return [{"pixel_values": pixels[i : i + 1]} for i in range(count)]
        if self.family == "idefics3":  # [1, every image's tiles, ...]: each image's tiles apart
            mask = np.asarray(out["pixel_attention_mask"])
            starts = np.concatenate([[0], np.cumsum(self._idefics3_tiles(out))])
            return [{"pixel_values": pixels[:, starts[i] : starts[i + 1]], "pixel_attention_mask": mask[:, starts[i] : starts[i + 1]]} for i in range(count)]
        grid = np.asarray(out["image_grid_thw"])
        sizes = grid.prod(axis=-1)
        starts = np.concatenate([[0], np.cumsum(sizes)])
        return [{"pixel_values": pixels[starts[i] : starts[i + 1]], "image_grid_thw": grid[i : i + 1]} for i in range(count)]

    def _tokens_per_image(self, out: Any, count: int) -> list[int]:
        ids = np.asarray(out["input_ids"][0])
        total = int((ids == self.image_token_id).sum())
        if self.family == "llava":
            return [total // count] * count if count else []
        if self.family == "idefics3":
            return [tiles * int(self.processor.image_seq_len) for tiles in self._idefics3_tiles(out)]
        merge = self._merge
        return [int(n) // (merge * merge) for n in np.asarray(out["image_grid_thw"]).prod(axis=-1)]


def mrope_positions(length: int, image_runs: list[tuple[int, int]], grids: list[tuple[int, int, int]], merge: int) -> tuple[Any, int]:
    """Qwen2-VL's M-RoPE positions of a prompt (Qwen2.5-VL's too: its `get_rope_index` spaces
    only a video's frames differently), as transformers' `get_rope_index` makes them:
    text counts on from the last position, an image's tokens take (start + t, start + row,
    start + column) over its merged grid, and the text after it starts at start + max(rows,
    columns). Returns `[3, length]` int64 and the delta later positions add."""
    out = np.zeros((3, length), dtype=np.int64)
    cursor, current = 0, 0
    for (start, count), (t, h, w) in zip(image_runs, grids):
        out[:, cursor:start] = np.arange(start - cursor) + current
        current += start - cursor
        rows, cols = h // merge, w // merge
        tt, hh, ww = np.meshgrid(np.arange(t), np.arange(rows), np.arange(cols), indexing="ij")
        out[:, start : start + count] = np.stack([tt.reshape(-1), hh.reshape(-1), ww.reshape(-1)]) + current
        current += max(rows, cols)
        cursor = start + count
    out[:, cursor:] = np.arange(length - cursor) + current
    return out, int(out.max()) + 1 - length if length else 0


def _pil(image: ImageInput) -> Any:
    from PIL import Image

    return Image.frombytes("RGB", (image.width, image.height), image.pixels)


def _runs(ids: list[int], image_token_id: int, counts: list[int]) -> list[tuple[tuple[int, int], ...]]:
    """Each image's placeholder positions, as (start, length) runs: placeholders are taken in
    order, `counts[i]` for image i."""
    positions = [i for i, t in enumerate(ids) if t == image_token_id]
    if len(positions) != sum(counts):
        raise InvalidRequest(f"The prompt has {len(positions)} image placeholder tokens where its images need {sum(counts)}.", param="messages")
    out = []
    cursor = 0
    for count in counts:
        mine = positions[cursor : cursor + count]
        cursor += count
        runs: list[tuple[int, int]] = []
        for position in mine:
            if runs and runs[-1][0] + runs[-1][1] == position:
                runs[-1] = (runs[-1][0], runs[-1][1] + 1)
            else:
                runs.append((position, 1))
        out.append(tuple(runs))
    return out


def load_processor(model_dir: Any, family: str) -> Any:
    """The model's processor on Pillow alone: no torchvision (PyPI's torchvision pairs with CUDA
    torch and does not import beside the CPU one). Qwen2-VL's and Qwen2.5-VL's processors are
    built from the image processor's Pillow backend and no video processor (videos are not served)."""
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

    if family in MROPE_MODEL_TYPES:
        import transformers

        base = transformers.Qwen2VLProcessor if family == "qwen2_vl" else transformers.Qwen2_5_VLProcessor

        class ImagesOnly(base):  # type: ignore[valid-type, misc]
            def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
                # The video processor's class check loads the video mapping, which needs torchvision.
                return None if argument_name == "video_processor" else super().check_argument_for_proper_class(argument_name, argument)

        image_processor = AutoImageProcessor.from_pretrained(model_dir, backend="pil")
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        return ImagesOnly(image_processor=image_processor, tokenizer=tokenizer, video_processor=_NoVideos(), chat_template=tokenizer.chat_template)
    return AutoProcessor.from_pretrained(model_dir, backend="pil")


class _NoVideos:
    """Stands in for Qwen2-VL's video processor (which needs torchvision): videos are refused."""

    model_input_names: list[str] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise InvalidRequest("Videos are not supported.", param="messages")
