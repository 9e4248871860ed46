"""LoRA adapters loaded and unloaded while serving (api/http/openai/lora.py, actors/lora_control.py):
POST /v1/load_lora_adapter and /v1/unload_lora_adapter as vLLM answers them, behind the API
key; a loaded adapter serves PEFT's own greedy text and is listed with its parent; paths
outside --lora-dir, a missing adapter or a taken name are a 400 naming the field with nothing
loaded; two adapters share one slot (--max-loras 1), concurrent requests for both served right;
an unloaded adapter is a 404, and a stream still running with it ends cleanly."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import trio

from tests.support.adapters import peft_greedy
from tests.support.servers import KEY, auth, start_server, tiny_config

PROMPT = [5, 17, 23, 9, 41, 2, 60]


async def test_adapters_load_and_unload_while_serving(tiny_model_dir: Path, lora_adapters: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    expected = {name: tokenizer.decode(peft_greedy(tiny_model_dir, path, [PROMPT])[0][:8]) for name, path in lora_adapters.items()}
    root = next(iter(lora_adapters.values())).parent
    monkeypatch.setenv("SWITCHYARD_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("SWITCHYARD_API_KEYS", KEY)
    config = tiny_config(tiny_model_dir, enable_lora=True, lora_dir=str(root), max_loras=1, spec_decoding="off")
    async with trio.open_nursery() as nursery:
        server = await start_server(nursery, config)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60, headers=auth()) as http:

            async def load(name: str, path: str) -> httpx.Response:
                return await http.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path})

            async def complete(model: str) -> httpx.Response:
                return await http.post("/v1/completions", json={"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True})

            async def listed() -> set[str]:
                return {m["id"] for m in (await http.get("/v1/models")).json()["data"]}

            async with httpx.AsyncClient(base_url=server.base_url) as anonymous:
                assert (await anonymous.post("/v1/load_lora_adapter", json={"lora_name": "q", "lora_path": "qv-r4"})).status_code == 401
            r = await load("q", "qv-r4")
            assert r.status_code == 200 and r.text == "Success: LoRA adapter 'q' added successfully.", r.text
            assert await listed() == {"tiny", "q"} and (await complete("q")).json()["choices"][0]["text"] == expected["qv-r4"]
            for name, path, field in [("x", "/etc", "lora_path"), ("x", "../..", "lora_path"), ("x", "nope", "lora_path"), ("tiny", "all-r8", "lora_name"), ("q", "all-r8", "lora_name")]:
                r = await load(name, path)
                assert r.status_code == 400 and r.json()["error"]["param"] == field, (name, path, r.text)
            assert await listed() == {"tiny", "q"}  # nothing loaded

            # one slot (--max-loras 1), two adapters: each takes it in turn, concurrent requests too
            assert (await load("a", str(root / "all-r8"))).status_code == 200  # an absolute path under the directory
            assert (await complete("a")).json()["choices"][0]["text"] == expected["all-r8"]
            async with trio.open_nursery() as both:
                texts: dict[str, str] = {}

                async def one(model: str, i: int) -> None:
                    texts[f"{model}{i}"] = (await complete(model)).json()["choices"][0]["text"]

                for i in range(3):
                    for model in ("q", "a", "tiny"):
                        both.start_soon(one, model, i)
            assert {texts[f"q{i}"] for i in range(3)} == {expected["qv-r4"]} and {texts[f"a{i}"] for i in range(3)} == {expected["all-r8"]}

            r = await http.post("/v1/unload_lora_adapter", json={"lora_name": "q"})
            assert r.status_code == 200 and "removed" in r.text
            assert (await complete("q")).status_code == 404 and (await http.post("/v1/unload_lora_adapter", json={"lora_name": "q"})).status_code == 404
            assert await listed() == {"tiny", "a"}

            # a stream still running with the adapter when it is unloaded ends, and the base serves on
            body = {"model": "a", "prompt": PROMPT, "max_tokens": 400, "ignore_eos": True, "stream": True}
            with trio.fail_after(60):
                async with http.stream("POST", "/v1/completions", json=body) as stream:
                    lines = stream.aiter_lines()
                    assert (await lines.__anext__()).startswith("data:")
                    assert (await http.post("/v1/unload_lora_adapter", json={"lora_name": "a"})).status_code == 200
                    rest = [line async for line in lines]
            assert any("error" in line for line in rest) and not any('"finish_reason": "length"' in line for line in rest), rest[-3:]
            assert (await complete("tiny")).status_code == 200 and await listed() == {"tiny"}
        server.stop.set()
