"""A model's generation_config.json supplies the sampling fields a request omits (`--generation-
config auto`, the default; `none`: the APIs' own), on Chat, Completions and Responses, and
/v1/models says which are in force. The tiny model here ships greedy defaults with a top_k, a
top_p and a repetition penalty: a request that names none of them gets exactly the output of
one that names them all, and the Responses object echoes the temperature and top_p it ran with.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import trio

from tests.support.servers import start_server, tiny_config

SHIPPED = {"do_sample": True, "temperature": 0.0, "top_p": 0.9, "top_k": 5, "repetition_penalty": 1.3}
ASK = [{"role": "user", "content": "Tell me a story"}]


async def test_the_models_defaults_fill_what_a_request_omits(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    await trio.to_thread.run_sync(shutil.copytree, tiny_model_dir, model)
    config = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**config, **SHIPPED}))
    named = {key: SHIPPED[key] for key in ("temperature", "top_p", "top_k", "repetition_penalty")}
    seen = {}
    for mode in ("auto", "none"):
        async with trio.open_nursery() as nursery:
            server = await start_server(nursery, tiny_config(model, generation_config=mode))
            async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:

                async def text(path: str, body: dict) -> str:
                    reply = (await client.post(path, json={"max_tokens": 12, "seed": 3, **body})).json()
                    return reply["choices"][0].get("message", {}).get("content") or reply["choices"][0].get("text")

                chat = [await text("/v1/chat/completions", {"messages": ASK}) for _ in range(2)]
                chat_named = await text("/v1/chat/completions", {"messages": ASK, **named})
                completion = await text("/v1/completions", {"prompt": "Once upon"})
                completion_named = await text("/v1/completions", {"prompt": "Once upon", **named})
                response = (await client.post("/v1/responses", json={"input": "Tell me a story", "max_output_tokens": 12})).json()
                card = (await client.get("/v1/models")).json()["data"][0]
            server.stop.set()
        seen[mode] = (chat, chat_named, completion, completion_named, response, card)
    chat, chat_named, completion, completion_named, response, card = seen["auto"]
    assert chat[0] == chat[1] == chat_named and completion == completion_named  # greedy, with the shipped filters and penalty
    assert (response["temperature"], response["top_p"]) == (0.0, 0.9)
    assert card["sampling_defaults"] == named
    chat, chat_named, completion, completion_named, response, card = seen["none"]
    assert (response["temperature"], response["top_p"]) == (1.0, 1.0) and "sampling_defaults" not in card
    assert chat[0] == chat[1] and chat[0] != chat_named  # seeded at temperature 1: the same seed, a different draw from greedy
