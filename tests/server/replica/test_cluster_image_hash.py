"""The serve-ray ingress's routing hashes of a prompt with images (api/cluster/ingress.py,
PromptHasher) are the chain the replica's prefix cache computes for it: each image's tokens
keyed by the image's content hash (runtime/prefix_hash.py keyed_token_ids). The same image
gives the same hashes, another image other hashes from its first block on; an image by URL
(never fetched by the ingress) stops the hashes before its tokens. The replica side is real
(api/cluster/host.py on a tiny LLaVA, its block manager's cached hashes read after); no Ray.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from api.cluster.ingress import PromptHasher
from tests.support.images import data_uri, png_bytes
from tests.support.servers import serve_once, tiny_config

pytestmark = pytest.mark.in_process  # the engine in the server's process (tests/conftest.py)

QUESTION = "What is in the picture? Say it in a few words."


def chat(url: str) -> dict[str, Any]:
    parts = [{"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": url}}]
    return {"model": "tiny", "messages": [{"role": "user", "content": parts}], "max_tokens": 2}


def common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def test_routing_hash_of_an_image_prompt_is_the_replica_cache_chain(llava_dir: Path, tmp_path: Path) -> None:
    config = tiny_config(llava_dir, max_num_batched_tokens=128)
    hasher = PromptHasher([config])
    body = chat(data_uri(png_bytes(seed=7)))
    hashes = hasher.hashes(body)
    answer, cached = serve_once(config, tmp_path, "/v1/chat/completions", body)
    assert len(hashes) == answer["usage"]["prompt_tokens"] // config.block_size > 6  # the image's 16 tokens included
    assert set(hashes) <= cached

    again = hasher.hashes(chat(data_uri(png_bytes(seed=7), mime="image/png")))
    other = hasher.hashes(chat(data_uri(png_bytes(seed=8))))
    assert again == hashes
    before_image = common(hashes, other)  # the blocks wholly before the image's first token
    assert 0 < before_image < len(hashes) and not set(other[before_image:]) & set(hashes)

    by_url = hasher.hashes(chat("https://images.example.com/a.png"))
    assert by_url == hashes[:before_image]  # never fetched here: the hashes stop before the image

    responses = {"model": "tiny", "input": [{"role": "user", "content": [
        {"type": "input_text", "text": QUESTION}, {"type": "input_image", "image_url": data_uri(png_bytes(seed=7))},
    ]}], "max_output_tokens": 2}  # fmt: skip
    assert hasher.hashes(responses, responses=True) == hashes
