"""/v1/models says which model path serves each model: native for the tiny Llama by default,
transformers when the server is started with --model-impl transformers."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import openai
import pytest
import trio

from tests.support.servers import start_server, tiny_config


@pytest.mark.parametrize("impl", ["auto", "transformers"])
async def test_models_list_shows_the_model_path(tiny_model_dir: Path, impl: str) -> None:
    async with trio.open_nursery() as nursery:
        srv = await start_server(nursery, tiny_config(tiny_model_dir, model_impl=impl))
        with openai.OpenAI(base_url=srv.openai_url, api_key="unused", max_retries=0, timeout=30) as client:
            models = await trio.to_thread.run_sync(partial(client.models.list))
        srv.stop.set()
    card = next(m for m in models.data if m.id == "tiny")
    assert card.model_extra["model_impl"] == ("native" if impl == "auto" else "transformers")
